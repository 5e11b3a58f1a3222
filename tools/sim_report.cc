// The report of `hybridkv sim`: text on stdout, --json, and the --svg plot.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hybridkv/units.h"
#include "sim_internal.h"

namespace hybridkv::tools {
namespace {

std::string svg_plot(const std::vector<Sample>& samples, const std::string& title) {
  const double w = 800, h = 360, left = 60, top = 30, pw = w - left - 20, ph = h - top - 50;
  const double max_step = samples.empty() ? 1 : std::max<double>(1, samples.back().step);
  auto path = [&](auto value) {
    std::string d;
    for (size_t i = 0; i < samples.size(); ++i) {
      const double x = left + pw * samples[i].step / max_step;
      const double y = top + ph * (1 - std::clamp(value(samples[i]), 0.0, 1.0));
      d += (i ? " L" : "M") + std::to_string(x) + " " + std::to_string(y);
    }
    return d;
  };
  std::string s =
      "<svg xmlns='http://www.w3.org/2000/svg' width='800' height='360' font-family='sans-serif' "
      "font-size='12'>\n";
  s += "<rect width='800' height='360' fill='white'/>\n";
  s += "<text x='60' y='18' font-size='14'>" + title + "</text>\n";
  s += "<rect x='60' y='30' width='" + std::to_string(pw) + "' height='" + std::to_string(ph) +
       "' fill='none' stroke='#888'/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = top + ph * (1 - i / 4.0);
    s += "<text x='25' y='" + std::to_string(y + 4) + "'>" + std::to_string(i * 25) + "%</text>\n";
  }
  s += "<path d='" + path([](const Sample& x) { return x.reuse_share; }) +
       "' fill='none' stroke='#1f77b4' stroke-width='2'/>\n";
  s += "<path d='" + path([](const Sample& x) { return x.gpu_used; }) +
       "' fill='none' stroke='#d62728' stroke-width='2'/>\n";
  s += "<text x='60' y='" + std::to_string(h - 12) +
       "' fill='#1f77b4'>reused / prompt tokens so far</text>\n";
  s += "<text x='300' y='" + std::to_string(h - 12) +
       "' fill='#d62728'>GPU slots in use (all pool groups)</text>\n";
  s += "<text x='560' y='" + std::to_string(h - 12) + "'>x: scheduler steps (" +
       std::to_string(static_cast<uint64_t>(max_step)) + ")</text>\n";
  s += "</svg>\n";
  return s;
}

struct StepTimes {
  double median = 0;
  double p99 = 0;
};

StepTimes step_times(std::vector<double> us) {
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

// The figures of a run, once, for the text and the JSON.
struct Figures {
  uint64_t bound = 0;
  uint64_t snapshot_hits = 0;
  uint64_t snapshot_lookups = 0;
  StepTimes times;
  double share(uint64_t part, uint64_t whole) const {
    return whole ? static_cast<double>(part) / whole : 0;
  }
};

nlohmann::json to_json(const SimOptions& o, const ModelDescription& model, size_t requests,
                       const SimCounters& c, const Figures& f, const testing::FakeEngine* engine,
                       double seconds) {
  nlohmann::json j;
  j["model"] = model.source;
  j["attention_only"] = o.attention_only;
  j["trace"] = o.trace;
  j["backend"] = o.backend;
  j["snapshot_policy"] = o.snapshot_policy;
  j["requests"] = requests;
  j["steps"] = c.steps;
  j["prompt_tokens"] = c.prompt_tokens;
  j["reused_tokens"] = c.reused_tokens;
  j["reuse_bound_tokens"] = f.bound;
  j["reused_share_of_prompt"] = f.share(c.reused_tokens, c.prompt_tokens);
  j["reused_share_of_bound"] = f.share(c.reused_tokens, f.bound);
  j["ssm_snapshot_hits"] = f.snapshot_hits;
  j["ssm_snapshot_lookups"] = f.snapshot_lookups;
  j["suspends"] = c.suspends;
  j["resumes"] = c.resumes;
  j["bytes_offloaded"] = c.bytes_offloaded;
  j["bytes_onboarded"] = c.bytes_onboarded;
  j["pages_dropped"] = c.pages_dropped;
  j["device_copies"] = c.device_copies;
  j["peak_gpu_slots"] = c.peak;
  j["manager_us_per_step_median"] = f.times.median;
  j["manager_us_per_step_p99"] = f.times.p99;
  j["verify"] = o.verify;
  j["verify_mismatches"] = c.mismatches;
  j["verify_pages_checked"] = engine ? engine->pages_checked() : 0;
  j["wall_seconds"] = seconds;
  return j;
}

void print_text(const SimOptions& o, const StoragePlan& plan, size_t requests, const SimCounters& c,
                const Figures& f, const testing::FakeEngine* engine) {
  using ull = unsigned long long;
  std::printf("requests            %zu (%llu steps)\n", requests, static_cast<ull>(c.steps));
  std::printf("prompt tokens       %llu\n", static_cast<ull>(c.prompt_tokens));
  std::printf(
      "reused tokens       %llu (%.2f%% of prompt)   bound %llu (%.2f%%)   reused/bound %.2f%%\n",
      static_cast<ull>(c.reused_tokens), 100 * f.share(c.reused_tokens, c.prompt_tokens),
      static_cast<ull>(f.bound), 100 * f.share(f.bound, c.prompt_tokens),
      100 * f.share(c.reused_tokens, f.bound));
  std::printf("SSM snapshot hits   %llu of %llu lookups\n", static_cast<ull>(f.snapshot_hits),
              static_cast<ull>(f.snapshot_lookups));
  std::printf("suspends / resumes  %llu / %llu\n", static_cast<ull>(c.suspends),
              static_cast<ull>(c.resumes));
  std::printf("offloaded           %s   onboarded %s   dropped pages %llu\n",
              format_bytes(c.bytes_offloaded).c_str(), format_bytes(c.bytes_onboarded).c_str(),
              static_cast<ull>(c.pages_dropped));
  std::printf("peak GPU slots      ");
  for (size_t i = 0; i < c.peak.size(); ++i) {
    std::printf(
        "pool group %zu: %llu of %llu  ", i, static_cast<ull>(c.peak[i]),
        static_cast<ull>(plan.slots(TierKind::kGpu, PoolGroupId(static_cast<uint32_t>(i)))));
  }
  std::printf("\nmanager CPU / step  median %.1f us, p99 %.1f us\n", f.times.median, f.times.p99);
  if (o.verify && engine != nullptr) {
    std::printf("verify              %llu mismatches, %llu pages checked\n",
                static_cast<ull>(c.mismatches), static_cast<ull>(engine->pages_checked()));
  }
}

}  // namespace

int report(const SimOptions& o, const ModelDescription& model,
           const std::vector<TraceRequest>& reqs, HybridCacheManager& h, const SimCounters& c,
           const testing::FakeEngine* engine, double seconds) {
  Figures f;
  f.bound = reuse_bound(reqs);
  f.times = step_times(c.step_us);
  if (h.state_group()) {
    const ReuseStats rs = h.manager().reuse_stats();
    f.snapshot_hits = rs.groups[h.state_group()->value].hits;
    f.snapshot_lookups = rs.groups[h.state_group()->value].lookups;
  }
  const nlohmann::json j = to_json(o, model, reqs.size(), c, f, engine, seconds);
  print_text(o, h.plan(), reqs.size(), c, f, engine);
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) return fail("--json: cannot write '" + o.json + "'");
    out << j.dump(2) << "\n";
  }
  if (!o.svg.empty()) {
    std::ofstream out(o.svg);
    if (!out) return fail("--svg: cannot write '" + o.svg + "'");
    out << svg_plot(c.samples, model.model_type + (o.attention_only ? " (attention only)" : "") +
                                   " on " + o.trace);
  }
  return c.mismatches == 0 ? 0 : 1;
}

}  // namespace hybridkv::tools
