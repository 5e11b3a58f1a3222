#include "sim.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hybridkv/hybrid.h"
#include "trace.h"
#include "util/units.h"
#include "verify/fake_engine.h"

namespace hybridkv::tools {
namespace {

using Clock = std::chrono::steady_clock;

int fail(const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "hybridkv sim: %s\n", line.c_str());
  return 2;
}

Result<SnapshotPolicy> parse_policy(const std::string& text) {
  SnapshotPolicy p;  // the end of the prompt is always a snapshot point, unless "no-end"
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.rfind("periodic:", 0) == 0) {
      try {
        p.periodic_interval = std::stoull(item.substr(9));
      } catch (...) {
        return Status::invalid("--snapshot-policy: bad interval in '" + item + "'");
      }
      if (*p.periodic_interval == 0) return Status::invalid("--snapshot-policy: interval 0");
    } else if (item == "branch") {
      p.branch_point = true;
    } else if (item == "demand") {
      p.demand_driven = true;
    } else if (item == "end") {
      p.final_prompt_boundary = true;
    } else if (item == "no-end") {
      p.final_prompt_boundary = false;
    } else if (item.rfind("start:", 0) == 0 || item.rfind("from-end:", 0) == 0) {
      try {
        const uint64_t v = std::stoull(item.substr(item.find(':') + 1));
        (item[0] == 's' ? p.offsets_from_start : p.offsets_from_end).push_back(v);
      } catch (...) {
        return Status::invalid("--snapshot-policy: bad offset in '" + item + "'");
      }
    } else {
      return Status::invalid(
          "--snapshot-policy: '" + item +
          "' is not periodic:N, start:N, from-end:N, end, no-end, branch or demand");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return p;
}

struct Running {
  uint64_t index;
  uint64_t generated = 0;
  uint64_t admitted_at = 0;  // admission order, for LIFO preemption
  verify::FakeRequest fake;
};

struct Sample {
  uint64_t step;
  double reuse_share;
  double gpu_used;
};

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

}  // namespace

void add_sim_command(CLI::App& app, SimOptions& o) {
  CLI::App* sim = app.add_subcommand("sim", "Replay a request trace through the cache");
  sim->add_option("--model", o.model, "HuggingFace config.json of the model")->required();
  sim->add_option("--trace", o.trace, "Mooncake JSONL trace, or synthetic:N[:SEED]")->required();
  sim->add_option("--limit", o.limit, "read at most this many requests");
  sim->add_option("--gpu-quota", o.gpu_quota, "GPU cache quota");
  sim->add_option("--host-quota", o.host_quota, "host tier quota");
  sim->add_option("--disk-quota", o.disk_quota, "disk tier quota (none backend only)");
  sim->add_option("--tp", o.tp, "tensor-parallel size");
  sim->add_option("--max-batch", o.max_batch, "requests per step");
  sim->add_option("--max-tokens-per-step", o.max_tokens_per_step, "token budget per step");
  sim->add_option("--snapshot-policy", o.snapshot_policy,
                  "comma list: periodic:N, start:N, from-end:N, end, branch, demand");
  sim->add_option("--spec-tokens", o.spec_tokens, "speculative tokens (replay buffers)");
  sim->add_option("--backend", o.backend, "none or host");
  sim->add_flag("--verify", o.verify, "check every page through the fake engine (host backend)");
  sim->add_flag("--attention-only", o.attention_only, "drop the recurrent layers");
  sim->add_option("--arrival", o.arrival, "asap or timestamps");
  sim->add_option("--step-ms", o.step_ms, "simulated milliseconds per step (timestamps)");
  sim->add_option("--typical-len", o.typical_len,
                  "tokens per request of the typical step that shapes the pool split");
  sim->add_option("--json", o.json, "write the report as JSON");
  sim->add_option("--svg", o.svg, "write a plot of reuse and memory over time");
  sim->add_flag("--quiet", o.quiet, "no progress output");
}

int run_sim_command(const SimOptions& o) {
  // --- inputs ---
  ServingConfig serving;
  serving.max_batch = o.max_batch;
  serving.num_spec_tokens = o.spec_tokens;
  serving.tokens_per_block = 32;
  serving.typical_len = o.typical_len;
  Result<SnapshotPolicy> policy = parse_policy(o.snapshot_policy);
  if (!policy) return fail(policy.status().message());
  serving.snapshots = *policy;
  serving.tiers.clear();
  for (const auto& [flag, text, kind] :
       {std::tuple<const char*, std::string, TierKind>{"--gpu-quota", o.gpu_quota, TierKind::kGpu},
        {"--host-quota", o.host_quota, TierKind::kHost},
        {"--disk-quota", o.disk_quota, TierKind::kDisk}}) {
    if (text.empty()) continue;
    const std::optional<uint64_t> q = parse_bytes(text);
    if (!q) return fail(std::string(flag) + ": cannot parse '" + text + "'");
    serving.tiers.push_back({kind, *q, kind == TierKind::kDisk ? "sim-disk" : ""});
  }
  if (o.max_batch == 0) return fail("--max-batch: 0 must be > 0");
  if (o.max_tokens_per_step == 0) return fail("--max-tokens-per-step: 0 must be > 0");
  BackendOptions backend;
  if (o.backend == "none")
    backend.kind = BackendKind::kNone;
  else if (o.backend == "host")
    backend.kind = BackendKind::kHost;
  else
    return fail("--backend: '" + o.backend + "' is not none or host");
  if (o.verify && backend.kind != BackendKind::kHost) return fail("--verify needs --backend host");
  if (o.arrival != "asap" && o.arrival != "timestamps")
    return fail("--arrival: '" + o.arrival + "' is not asap or timestamps");

  ModelOptions mo;
  mo.tp_size = o.tp;
  if (o.tp == 0) return fail("--tp: 0 must be > 0");
  Result<ModelDescription> model = read_model_config(o.model, mo);
  if (!model) return fail(model.status().message());
  if (o.attention_only) {
    // Same trace, same byte budget, no recurrent layers: the cost of hybrid state on reuse.
    std::vector<ModelLayer> kept;
    for (const ModelLayer& l : model->layers) {
      if (l.is_attention()) kept.push_back(l);
    }
    if (kept.empty()) return fail("--attention-only: the model has no attention layers");
    for (size_t i = 0; i < kept.size(); ++i) kept[i].cache_layer = static_cast<LayerId>(i);
    model->layers = kept;
  }
  Result<std::vector<TraceRequest>> trace = o.trace.rfind("synthetic:", 0) == 0
                                                ? synthetic_trace(o.trace)
                                                : read_mooncake_trace(o.trace, o.limit);
  if (!trace) return fail(trace.status().message());
  const std::vector<TraceRequest>& reqs = *trace;

  Result<std::unique_ptr<HybridCacheManager>> created =
      HybridCacheManager::create(*model, serving, backend);
  if (!created) return fail(created.status().message());
  HybridCacheManager& h = **created;
  KvCacheManager& m = h.manager();
  std::unique_ptr<verify::FakeEngine> engine;
  if (o.verify) {
    engine = std::make_unique<verify::FakeEngine>(m);
    // Real-size states: write and check 16 bytes at each end of every token region and state
    // (a page in the wrong slot, stale or overwritten still shows at its first bytes).
    engine->set_sampled_writes(16);
    engine->set_sampled_check(16);
  }

  // --- the loop ---
  std::deque<uint64_t> waiting;
  std::vector<Running> running;
  std::vector<Running> suspended;  // a stack: last in, first out
  uint64_t next_arrival = 0, finished = 0, step = 0, clock_ms = 0, admitted = 0;
  uint64_t prompt_tokens = 0, reused_tokens = 0, suspends = 0, resumes = 0, mismatches = 0;
  uint64_t bytes_offloaded = 0, bytes_onboarded = 0, pages_dropped = 0, device_copies = 0;
  std::vector<double> step_us;
  std::vector<uint64_t> peak(h.plan().pool_groups().size(), 0);
  std::vector<Sample> samples;
  std::string first_error;
  const bool tty = !o.quiet && isatty(STDERR_FILENO);
  auto last_progress = Clock::now();
  const auto started = Clock::now();
  auto all_tokens = [&](uint64_t index, uint64_t n) {
    std::vector<int32_t> t(reqs[index].prompt);
    t.insert(t.end(), reqs[index].output.begin(),
             reqs[index].output.begin() + static_cast<int64_t>(n));
    return t;
  };
  auto check = [&](const Status& s, const char* what) {
    if (!s.is_ok() && first_error.empty()) first_error = std::string(what) + ": " + s.to_string();
    if (!s.is_ok()) ++mismatches;
  };

  while (finished < reqs.size()) {
    if (!first_error.empty()) break;
    double manager_us = 0;
    auto timed = [&](auto&& fn) {
      const auto t0 = Clock::now();
      auto r = fn();
      manager_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      return r;
    };
    // Arrivals.
    while (next_arrival < reqs.size() &&
           (o.arrival == "asap" || reqs[next_arrival].timestamp_ms <= clock_ms)) {
      waiting.push_back(next_arrival++);
    }
    // Suspended requests come back first, last in first out.
    while (!suspended.empty() && running.size() < o.max_batch) {
      Running& r = suspended.back();
      if (!timed([&] { return h.resume(r.index); }).is_ok()) break;
      ++resumes;
      if (engine) check(engine->verify(*h.cache(r.index), r.fake), "verify after resume");
      running.push_back(std::move(r));
      suspended.pop_back();
    }
    // New requests.
    while (suspended.empty() && !waiting.empty() && running.size() < o.max_batch) {
      const uint64_t index = waiting.front();
      const Status added = timed([&] { return h.add_request(index, reqs[index].prompt); });
      if (!added.is_ok()) {
        first_error = "add_request: " + added.to_string();
        break;
      }
      Running r;
      r.index = index;
      r.admitted_at = admitted++;
      const uint64_t reused = h.cache(index)->reuse_match().reused_tokens;
      prompt_tokens += reqs[index].input_length;
      reused_tokens += reused;
      if (engine) {
        r.fake.tokens = {all_tokens(index, reqs[index].output_length)};
        verify::FakeEngine::adopt_reuse(*h.cache(index), r.fake);
      }
      waiting.pop_front();
      if (!timed([&] { return h.resume(index); }).is_ok()) {
        suspended.push_back(std::move(r));  // no room now: it waits on the stack
        break;
      }
      if (engine) check(engine->verify(*h.cache(index), r.fake), "verify after admission");
      running.push_back(std::move(r));
    }
    if (running.empty() && suspended.empty() && waiting.empty() && next_arrival < reqs.size()) {
      clock_ms = reqs[next_arrival].timestamp_ms;  // idle until the next arrival
      continue;
    }
    if (running.empty() && !suspended.empty()) {
      first_error =
          "deadlock: a suspended request cannot resume with nothing running (the GPU "
          "quota holds less than one request)";
      break;
    }
    // One step: prefill chunks under the token budget, one decode token per decoding request.
    uint64_t budget = o.max_tokens_per_step;
    for (size_t i = 0; i < running.size();) {
      Running& r = running[i];
      const TraceRequest& t = reqs[r.index];
      KvCache& cache = *h.cache(r.index);
      const uint64_t history = cache.history();
      const bool prefill = history < t.input_length;
      uint64_t upto;
      if (prefill) {
        if (budget == 0) {
          ++i;
          continue;
        }
        const uint64_t point = *h.next_snapshot_point(r.index);
        upto = std::min(point, history + budget);
        budget -= upto - history;
      } else {
        upto = history + 1;
      }
      Status s = timed([&] { return h.resize(r.index, upto, engine ? history : upto); });
      if (s.code() == StatusCode::kOutOfPages) {
        // Memory pressure: the most recently admitted request gives way (last in, first out).
        auto victim = std::max_element(
            running.begin(), running.end(),
            [](const Running& a, const Running& b) { return a.admitted_at < b.admitted_at; });
        check(timed([&] { return h.suspend(victim->index); }), "suspend");
        ++suspends;
        const bool self = victim == running.begin() + static_cast<int64_t>(i);
        suspended.push_back(std::move(*victim));
        running.erase(victim);
        if (!self && static_cast<size_t>(victim - running.begin()) < i) --i;
        continue;  // retry (or move on when the victim was this request)
      }
      if (!s.is_ok()) {
        first_error = "resize: " + s.to_string();
        break;
      }
      if (engine) {
        check(engine->write_step(cache, r.fake, upto), "step");
        check(timed([&] { return h.resize(r.index, upto, upto); }), "resize");
      }
      if (prefill) {
        const Status c = timed([&] { return h.commit_at_snapshot(r.index); });
        if (!c.is_ok() && c.code() != StatusCode::kOutOfPages)
          check(c, "commit");  // full: not published
      } else {
        ++r.generated;
      }
      if (!prefill && r.generated >= t.output_length) {
        // Done. Generated tokens are not committed: in these traces a later prompt never holds
        // an earlier request's output (it arrives as new hash ids), so publishing it would
        // only take tree memory from the prompts.
        if (engine) check(engine->verify(cache, r.fake), "verify before free");
        check(timed([&] { return h.free_request(r.index); }), "free");
        ++finished;
        running.erase(running.begin() + static_cast<int64_t>(i));
        continue;
      }
      ++i;
    }
    // Statistics of the step.
    const IterationStats it = m.take_iteration_stats();
    bytes_offloaded += it.bytes_offloaded;
    bytes_onboarded += it.bytes_onboarded;
    pages_dropped += it.pages_dropped;
    device_copies += it.device_copies;
    const StorageStats st = m.storage_stats();
    uint64_t used = 0, total = 0;
    for (const PoolGroupStorage& pg : st.tiers[0].pool_groups) {
      peak[pg.pool_group.value] =
          std::max(peak[pg.pool_group.value], pg.total_slots - pg.free_slots);
      used += (pg.total_slots - pg.free_slots) * h.plan().pool_group(pg.pool_group).slot_bytes;
      total += pg.total_slots * h.plan().pool_group(pg.pool_group).slot_bytes;
    }
    step_us.push_back(manager_us);
    if (step % 64 == 0) {
      samples.push_back({step,
                         prompt_tokens ? static_cast<double>(reused_tokens) / prompt_tokens : 0,
                         total ? static_cast<double>(used) / total : 0});
    }
    ++step;
    clock_ms += o.step_ms;
    if (!o.quiet && Clock::now() - last_progress > std::chrono::milliseconds(tty ? 200 : 10000)) {
      last_progress = Clock::now();
      const double done = static_cast<double>(finished) / reqs.size();
      if (tty) {
        const int bar = static_cast<int>(done * 30);
        std::fprintf(stderr, "\r[%-30s] %5.1f%%  %llu/%zu requests  reuse %.1f%%",
                     std::string(bar, '#').c_str(), done * 100,
                     static_cast<unsigned long long>(finished), reqs.size(),
                     prompt_tokens ? 100.0 * reused_tokens / prompt_tokens : 0.0);
      } else {
        std::fprintf(stderr, "sim: %llu/%zu requests done, step %llu, reuse %.1f%%\n",
                     static_cast<unsigned long long>(finished), reqs.size(),
                     static_cast<unsigned long long>(step),
                     prompt_tokens ? 100.0 * reused_tokens / prompt_tokens : 0.0);
      }
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!first_error.empty()) return fail(first_error);

  // --- the report ---
  std::sort(step_us.begin(), step_us.end());
  const double median = step_us.empty() ? 0 : step_us[step_us.size() / 2];
  const double p99 =
      step_us.empty() ? 0 : step_us[std::min(step_us.size() - 1, step_us.size() * 99 / 100)];
  const uint64_t bound = reuse_bound(reqs);
  const ReuseStats rs = m.reuse_stats();
  uint64_t snapshot_hits = 0, snapshot_lookups = 0;
  if (h.state_group()) {
    snapshot_hits = rs.groups[h.state_group()->value].hits;
    snapshot_lookups = rs.groups[h.state_group()->value].lookups;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  nlohmann::json j;
  j["model"] = model->source;
  j["attention_only"] = o.attention_only;
  j["trace"] = o.trace;
  j["backend"] = o.backend;
  j["snapshot_policy"] = o.snapshot_policy;
  j["requests"] = reqs.size();
  j["steps"] = step;
  j["prompt_tokens"] = prompt_tokens;
  j["reused_tokens"] = reused_tokens;
  j["reuse_bound_tokens"] = bound;
  j["reused_share_of_prompt"] =
      prompt_tokens ? static_cast<double>(reused_tokens) / prompt_tokens : 0;
  j["reused_share_of_bound"] = bound ? static_cast<double>(reused_tokens) / bound : 0;
  j["ssm_snapshot_hits"] = snapshot_hits;
  j["ssm_snapshot_lookups"] = snapshot_lookups;
  j["suspends"] = suspends;
  j["resumes"] = resumes;
  j["bytes_offloaded"] = bytes_offloaded;
  j["bytes_onboarded"] = bytes_onboarded;
  j["pages_dropped"] = pages_dropped;
  j["device_copies"] = device_copies;
  j["peak_gpu_slots"] = peak;
  j["manager_us_per_step_median"] = median;
  j["manager_us_per_step_p99"] = p99;
  j["verify"] = o.verify;
  j["verify_mismatches"] = mismatches;
  j["verify_pages_checked"] = engine ? engine->pages_checked() : 0;
  j["wall_seconds"] = seconds;
  std::printf("requests            %zu (%llu steps)\n", reqs.size(),
              static_cast<unsigned long long>(step));
  std::printf("prompt tokens       %llu\n", static_cast<unsigned long long>(prompt_tokens));
  std::printf(
      "reused tokens       %llu (%.2f%% of prompt)   bound %llu (%.2f%%)   reused/bound %.2f%%\n",
      static_cast<unsigned long long>(reused_tokens),
      prompt_tokens ? 100.0 * reused_tokens / prompt_tokens : 0.0,
      static_cast<unsigned long long>(bound), prompt_tokens ? 100.0 * bound / prompt_tokens : 0.0,
      bound ? 100.0 * reused_tokens / bound : 0.0);
  std::printf("SSM snapshot hits   %llu of %llu lookups\n",
              static_cast<unsigned long long>(snapshot_hits),
              static_cast<unsigned long long>(snapshot_lookups));
  std::printf("suspends / resumes  %llu / %llu\n", static_cast<unsigned long long>(suspends),
              static_cast<unsigned long long>(resumes));
  std::printf("offloaded           %s   onboarded %s   dropped pages %llu\n",
              format_bytes(bytes_offloaded).c_str(), format_bytes(bytes_onboarded).c_str(),
              static_cast<unsigned long long>(pages_dropped));
  std::printf("peak GPU slots      ");
  for (size_t i = 0; i < peak.size(); ++i) {
    std::printf("pool group %zu: %llu of %llu  ", i, static_cast<unsigned long long>(peak[i]),
                static_cast<unsigned long long>(
                    h.plan().slots(TierKind::kGpu, PoolGroupId(static_cast<uint32_t>(i)))));
  }
  std::printf("\nmanager CPU / step  median %.1f us, p99 %.1f us\n", median, p99);
  if (o.verify) {
    std::printf("verify              %llu mismatches, %llu pages checked\n",
                static_cast<unsigned long long>(mismatches),
                static_cast<unsigned long long>(engine->pages_checked()));
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) return fail("--json: cannot write '" + o.json + "'");
    out << j.dump(2) << "\n";
  }
  if (!o.svg.empty()) {
    std::ofstream out(o.svg);
    if (!out) return fail("--svg: cannot write '" + o.svg + "'");
    out << svg_plot(samples, model->model_type + (o.attention_only ? " (attention only)" : "") +
                                 " on " + o.trace);
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace hybridkv::tools
