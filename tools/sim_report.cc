// The report of `hybridkv sim`: text on stdout, --json, and the --svg plot.
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hybridkv/units.h"
#include "sim_internal.h"
#include "sim_step_times.h"

namespace hybridkv::tools {
namespace {

// The figures of a run, once, for the text and the JSON.
struct Figures {
  uint64_t bound = 0;
  uint64_t snapshot_hits = 0;
  uint64_t snapshot_lookups = 0;
  std::array<uint64_t, 3> snapshot_tiers{};  // snapshot pages served per tier (GPU, host, disk)
  StepTimes times;
  double share(uint64_t part, uint64_t whole) const {
    return whole ? static_cast<double>(part) / whole : 0;
  }
};

// What a pool group holds, for people: "state" (recurrent states and snapshots), "attention"
// (KV blocks), "replay" (PRIVATE speculative-decoding state).
std::string pool_group_name(const StoragePlan& plan, const PoolGroup& pg) {
  if (pg.snapshots_of) {
    return "pool group " + std::to_string(pg.id.value) + " (" +
           dtype_name(*plan.config().snapshot_dtype) + " snapshots)";
  }
  bool ssm = false, attention = false, private_only = true;
  for (CacheGroupId g : pg.groups) {
    const CacheGroup& group = plan.cache_group(g);
    (group.kind == GroupKind::kSsm ? ssm : attention) = true;
    private_only = private_only && group.policy == ReusePolicy::kPrivate;
  }
  const std::string what = ssm && private_only ? "replay"
                           : ssm && attention  ? "state+attention"
                           : ssm               ? "state"
                                               : "attention";
  return "pool group " + std::to_string(pg.id.value) + " (" + what + ")";
}

std::vector<std::string> pool_group_names(const StoragePlan& plan) {
  std::vector<std::string> names;
  for (const PoolGroup& pg : plan.pool_groups()) names.push_back(pool_group_name(plan, pg));
  return names;
}

// Every flag, so that a run can be reproduced from its JSON.
nlohmann::json settings_json(const SimOptions& o) {
  return {{"model", o.model},
          {"trace", o.trace},
          {"limit", o.limit},
          {"gpu_quota", o.gpu_quota},
          {"host_quota", o.host_quota},
          {"disk_quota", o.disk_quota},
          {"tp", o.tp},
          {"pp", o.pp},
          {"pp_rank", o.pp_rank},
          {"max_batch", o.max_batch},
          {"max_tokens_per_step", o.max_tokens_per_step},
          {"snapshot_policy", o.snapshot_policy},
          {"spec_tokens", o.spec_tokens},
          {"backend", o.backend},
          {"verify", o.verify},
          {"attention_only", o.attention_only},
          {"arrival", o.arrival},
          {"admission", o.admission},
          {"evict_ahead", o.evict_ahead},
          {"upkeep", o.upkeep},
          {"admit_ahead", o.admit_ahead},
          {"onboard_in_step", o.onboard_in_step},
          {"create_ahead", o.create_ahead},
          {"touch_queued", o.touch_queued},
          {"after_launch", o.after_launch},
          {"schedule_ahead", o.schedule_ahead},
          {"step_ms", o.step_ms},
          {"typical_len", o.typical_len},
          {"rebalance", o.rebalance},
          {"offload", o.offload},
          {"eviction", o.eviction},
          {"snapshot_dtype", o.snapshot_dtype},
          {"colder_copies", o.colder_copies},
          {"host_link_gbps", o.host_link_gbps},
          {"disk_link_gbps", o.disk_link_gbps}};
}

// One colder tier's moves over the run and the bus time they take at the link's rates: the
// offloads that ran (cancelled ones moved nothing) and the onboards.
struct TierMoves {
  std::string tier;
  TierIterationStats moves;
  LinkRate link;
  double bus_seconds() const {
    const double ran = static_cast<double>(moves.offloaded_bytes - moves.offload_cancelled_bytes);
    return ran / (link.down * 1e9) + static_cast<double>(moves.onboarded_bytes) / (link.up * 1e9);
  }
};

std::vector<TierMoves> tier_moves(const SimOptions& o, const StoragePlan& plan,
                                  const SimCounters& c) {
  std::vector<TierMoves> out;
  for (size_t t = 1; t < plan.tiers().size() && t < c.tier_moves.size(); ++t) {
    const TierKind kind = plan.tiers()[t].kind;
    const bool disk = kind == TierKind::kDisk;
    const Result<LinkRate> link = parse_link(disk ? "--disk-link-gbps" : "--host-link-gbps",
                                             disk ? o.disk_link_gbps : o.host_link_gbps);
    out.push_back({tier_kind_name(kind), c.tier_moves[t], *link});  // checked before the run
  }
  return out;
}

void print_tier_moves(const std::vector<TierMoves>& tiers) {
  for (const TierMoves& t : tiers) {
    const TierIterationStats& m = t.moves;
    std::printf(
        "%-20s%s down (%s of it ran, %s cancelled), %s up; bus %.2f s at %.3g / %.3g GB/s\n",
        (std::string(t.tier) + " tier moves").c_str(), format_bytes(m.offloaded_bytes).c_str(),
        format_bytes(m.offloaded_bytes - m.offload_cancelled_bytes).c_str(),
        format_bytes(m.offload_cancelled_bytes).c_str(), format_bytes(m.onboarded_bytes).c_str(),
        t.bus_seconds(), t.link.down, t.link.up);
    if (m.returned_to_copy_bytes > 0) {
      std::printf("%-20s%s more went back to the copy this tier kept (no transfer)\n", "",
                  format_bytes(m.returned_to_copy_bytes).c_str());
    }
  }
}

// What ran, before the figures.
void print_header(const SimOptions& o, const ModelDescription& model, HybridCacheManager& h,
                  size_t requests) {
  const StoragePlan& plan = h.plan();
  std::printf("model               %s (%s%s), TP %u\n", o.model.c_str(), model.model_type.c_str(),
              o.attention_only ? ", recurrent layers dropped: --attention-only" : "", o.tp);
  std::printf("trace               %s: %zu requests, arrival %s\n", o.trace.c_str(), requests,
              o.arrival.c_str());
  std::printf("backend             %s\n", o.backend.c_str());
  for (const TierPlan& t : plan.tiers()) {
    std::printf("%-20s%s", (std::string(tier_kind_name(t.kind)) + " tier").c_str(),
                format_bytes(t.quota).c_str());
    for (const PoolGroup& pg : plan.pool_groups()) {
      std::printf("; %s %llu slots", pool_group_name(plan, pg).c_str(),
                  static_cast<unsigned long long>(t.slots[pg.id.value]));
    }
    std::printf("\n");
  }
  std::printf(
      "scheduler           max batch %u, %llu tokens per step, %s admission, snapshot policy "
      "%s\n",
      o.max_batch, static_cast<unsigned long long>(o.max_tokens_per_step), o.admission.c_str(),
      o.snapshot_policy.c_str());
  std::printf("\n");
}

nlohmann::json to_json(const SimOptions& o, const ModelDescription& model, const StoragePlan& plan,
                       size_t requests, const SimCounters& c, const Figures& f,
                       const testing::FakeEngine* engine, double seconds) {
  nlohmann::json j;
  j["settings"] = settings_json(o);
  j["model"] = model.source;
  j["attention_only"] = o.attention_only;
  j["trace"] = o.trace;
  j["backend"] = o.backend;
  j["snapshot_policy"] = o.snapshot_policy;
  j["requests"] = requests;
  j["requests_skipped"] = c.skipped;
  j["recomputes"] = c.recomputes;
  j["failed_admissions"] = c.failed_admissions;
  j["onboard_waits"] = c.onboard_waits;
  j["idle_joins"] = c.idle_joins;
  j["most_joins_in_a_step"] = c.most_joins;
  j["bytes_offload_cancelled"] = c.bytes_offload_cancelled;
  j["steps"] = c.steps;
  j["prompt_tokens"] = c.prompt_tokens;
  j["reused_tokens"] = c.reused_tokens;
  if (!o.shared_redis.empty()) {
    j["instance"] = o.instance;
    j["shared_fetch_seconds"] = c.shared_fetch_us / 1e6;
  }
  j["reuse_bound_tokens"] = f.bound;
  j["reused_share_of_prompt"] = f.share(c.reused_tokens, c.prompt_tokens);
  j["reused_share_of_bound"] = f.share(c.reused_tokens, f.bound);
  j["matched_tree_tokens"] = c.tree_tokens;
  j["matched_kv_tokens"] = c.kv_tokens;
  j["dropped_snapshot_tokens"] = c.dropped_snapshot_tokens;
  j["ssm_snapshot_hits"] = f.snapshot_hits;
  j["ssm_snapshots_served_by_tier"] = {
      {"gpu", f.snapshot_tiers[0]}, {"host", f.snapshot_tiers[1]}, {"disk", f.snapshot_tiers[2]}};
  j["ssm_snapshot_lookups"] = f.snapshot_lookups;
  j["suspends"] = c.suspends;
  j["resumes"] = c.resumes;
  j["bytes_offloaded"] = c.bytes_offloaded - c.bytes_offload_cancelled;  // copies that ran
  j["bytes_onboarded"] = c.bytes_onboarded;
  j["bytes_copies_kept"] = c.bytes_copies_kept;
  j["tier_moves"] = nlohmann::json::array();
  for (const TierMoves& t : tier_moves(o, plan, c)) {
    j["tier_moves"].push_back({{"tier", t.tier},
                               {"offloaded_bytes", t.moves.offloaded_bytes},
                               {"offload_cancelled_bytes", t.moves.offload_cancelled_bytes},
                               {"onboarded_bytes", t.moves.onboarded_bytes},
                               {"returned_to_copy_bytes", t.moves.returned_to_copy_bytes},
                               {"bus_seconds", t.bus_seconds()}});
  }
  j["pages_dropped"] = c.pages_dropped;
  j["device_copies"] = c.device_copies;
  j["rebalancing_steps"] = c.adjustments;
  j["slots_at_end"] = c.end_slots;
  j["peak_gpu_slots"] = c.peak;
  j["manager_us_per_step_median"] = f.times.median;
  j["manager_us_per_step_p90"] = f.times.p90;
  j["manager_us_per_step_p99"] = f.times.p99;
  j["manager_us_per_step_max"] = f.times.max;
  j["steps_over_100us_share"] = f.times.over_slow;
  j["steps_descheduled"] = f.times.descheduled;
  j["manager_us_per_step_median_undisturbed"] = f.times.undisturbed_median;
  j["manager_us_per_step_p99_undisturbed"] = f.times.undisturbed_p99;
  j["steps_over_100us_share_undisturbed"] = f.times.undisturbed_over_slow;
  j["evict_ahead_us_per_step_p99"] = f.times.evict_p99;
  j["evict_ahead_seconds"] = f.times.evict_total / 1e6;
  j["admit_ahead_seconds"] = f.times.admit_total / 1e6;
  j["touch_queued_seconds"] = f.times.touch_total / 1e6;
  j["schedule_ahead_seconds"] = f.times.schedule_total / 1e6;
  j["after_launch_seconds"] = f.times.after_total / 1e6;
  j["after_launch_us_per_step_p99"] = f.times.after_p99;
  j["ahead_us_per_step_p99"] = f.times.ahead_p99;
  j["pages_prefetched"] = c.pages_prefetched;
  j["requests_created_ahead"] = c.created_ahead;
  j["most_created_ahead"] = c.most_created_ahead;
  nlohmann::json slow;
  for (size_t op = 0; op < kSimOps; ++op) slow[kSimOpNames[op]] = f.times.slow_ops_us[op];
  j["slowest_steps_us_by_call"] = slow;
  j["slowest_steps"] = f.times.slow_steps;
  j["slowest_steps_evicted_pages"] = f.times.slow_evictions;  // by the steps' own calls
  j["prompt_hash_ahead_us"] = c.hash_ahead_us;
  j["verify"] = o.verify;
  j["verify_mismatches"] = c.mismatches;
  j["verify_pages_checked"] = engine ? engine->pages_checked() : 0;
  j["wall_seconds"] = seconds;
  return j;
}

// Where the tokens between the bound and the reused ones went, in the order a match loses them.
void print_losses(const SimCounters& c, const Figures& f) {
  using ull = unsigned long long;
  const uint64_t tree = std::min(c.tree_tokens, f.bound);
  const uint64_t no_snapshot = c.kv_tokens - c.reused_tokens;
  std::printf(
      "reuse lost          %llu not in the tree; %llu in the tree without KV; %llu with KV and "
      "no snapshot at its end (%llu where a snapshot had been dropped)\n",
      static_cast<ull>(f.bound - tree), static_cast<ull>(c.tree_tokens - c.kv_tokens),
      static_cast<ull>(no_snapshot), static_cast<ull>(c.dropped_snapshot_tokens));
}

void print_text(const SimOptions& o, const StoragePlan& plan, size_t requests, const SimCounters& c,
                const Figures& f, const testing::FakeEngine* engine) {
  using ull = unsigned long long;
  std::printf("requests            %zu run in %llu steps", requests - c.skipped,
              static_cast<ull>(c.steps));
  if (c.skipped > 0) {
    std::printf(
        "; %llu skipped: longer than one request can be on the GPU (the longest needs %llu "
        "tokens)",
        static_cast<ull>(c.skipped), static_cast<ull>(c.skipped_longest));
  }
  std::printf("\n");
  std::printf("prompt tokens       %llu\n", static_cast<ull>(c.prompt_tokens));
  std::printf(
      "reused tokens       %llu (%.2f%% of prompt)   bound %llu (%.2f%%)   reused/bound %.2f%%\n"
      "                    (bound: what unlimited memory would reuse of the same prompts)\n",
      static_cast<ull>(c.reused_tokens), 100 * f.share(c.reused_tokens, c.prompt_tokens),
      static_cast<ull>(f.bound), 100 * f.share(f.bound, c.prompt_tokens),
      100 * f.share(c.reused_tokens, f.bound));
  print_losses(c, f);
  std::printf(
      "SSM snapshot hits   %llu of %llu lookups (re-admissions after recompute count); served "
      "from GPU %llu, host %llu, disk %llu\n",
      static_cast<ull>(f.snapshot_hits), static_cast<ull>(f.snapshot_lookups),
      static_cast<ull>(f.snapshot_tiers[0]), static_cast<ull>(f.snapshot_tiers[1]),
      static_cast<ull>(f.snapshot_tiers[2]));
  std::printf(
      "preemptions         %llu suspended (pages kept) / %llu resumed; %llu freed and "
      "recomputed; %llu admissions waited for room\n"
      "joins               at most %llu requests in one step; %llu joined in a step without "
      "computing in it\n",
      static_cast<ull>(c.suspends), static_cast<ull>(c.resumes), static_cast<ull>(c.recomputes),
      static_cast<ull>(c.failed_admissions), static_cast<ull>(c.most_joins),
      static_cast<ull>(c.idle_joins));
  if (o.onboard_in_step > 0) {
    std::printf(
        "onboarding          %llu times a resumption or admission waited a step while its pages "
        "came up (more than %llu away)\n",
        static_cast<ull>(c.onboard_waits), static_cast<ull>(o.onboard_in_step));
  }
  std::printf("offloaded           %s   onboarded %s   dropped pages %llu\n",
              format_bytes(c.bytes_offloaded - c.bytes_offload_cancelled).c_str(),
              format_bytes(c.bytes_onboarded).c_str(), static_cast<ull>(c.pages_dropped));
  if (c.bytes_offload_cancelled > 0) {
    std::printf(
        "                    (%s more offloads were cancelled: their pages were dropped "
        "before the copy ran)\n",
        format_bytes(c.bytes_offload_cancelled).c_str());
  }
  print_tier_moves(tier_moves(o, plan, c));
  std::printf("peak GPU slots      ");
  for (const PoolGroup& pg : plan.pool_groups()) {
    std::printf("%s: %llu (plan %llu)  ", pool_group_name(plan, pg).c_str(),
                static_cast<ull>(c.peak[pg.id.value]),
                static_cast<ull>(plan.slots(TierKind::kGpu, pg.id)));
  }
  std::printf("\n");
  if (o.rebalance == "on") {
    std::printf("rebalancing         %llu steps; slots at the end:",
                static_cast<ull>(c.adjustments));
    for (size_t t = 0; t < c.end_slots.size(); ++t) {
      std::printf(" %s", tier_kind_name(plan.tiers()[t].kind));
      for (const PoolGroup& pg : plan.pool_groups())
        std::printf(" %s %llu", pool_group_name(plan, pg).c_str(),
                    static_cast<ull>(c.end_slots[t][pg.id.value]));
      std::printf(";");
    }
    std::printf("\n");
  }
  std::printf(
      "manager CPU / step  median %.1f us, p90 %.1f, p99 %.1f, max %.0f; %.1f %% of steps over "
      "%.0f us\n",
      f.times.median, f.times.p90, f.times.p99, f.times.max, 100 * f.times.over_slow, kSlowStepUs);
  if (f.times.descheduled > 0) {
    std::printf(
        "                    %llu steps (%.2f %%) lost the core to another process; without them "
        "median %.1f us, p99 %.1f, %.1f %% over %.0f us\n",
        static_cast<ull>(f.times.descheduled), 100.0 * f.times.descheduled / c.step_us.size(),
        f.times.undisturbed_median, f.times.undisturbed_p99, 100 * f.times.undisturbed_over_slow,
        kSlowStepUs);
  }
  if (o.evict_ahead > 0) {
    std::printf(
        "evict ahead         %.1f s in all, p99 %.1f us per step (while the GPU computes: not in "
        "the step's time)\n",
        f.times.evict_total / 1e6, f.times.evict_p99);
  }
  if (o.admit_ahead > 0) {
    std::printf(
        "admit ahead         %.1f s in all (%llu pages onboarded ahead of their resume; %llu "
        "requests created ahead, at most %llu at once); all work ahead p99 %.1f us per step (not "
        "in the step's time)\n",
        f.times.admit_total / 1e6, static_cast<ull>(c.pages_prefetched),
        static_cast<ull>(c.created_ahead), static_cast<ull>(c.most_created_ahead),
        f.times.ahead_p99);
  }
  if (o.touch_queued > 0) {
    std::printf(
        "touch queued        %.1f s in all (the next %llu waiting requests' prefixes); all work "
        "ahead p99 %.1f us per step (not in the step's time)\n",
        f.times.touch_total / 1e6, static_cast<ull>(o.touch_queued), f.times.ahead_p99);
  }
  if (o.after_launch) {
    std::printf(
        "after the launch    %.1f s in all (the steps' commits, frees and rebalancing), p99 "
        "%.1f us per step; all work while the GPU computes p99 %.1f us per step (not in the "
        "step's time)\n",
        f.times.after_total / 1e6, f.times.after_p99, f.times.ahead_p99);
  }
  if (o.schedule_ahead) {
    std::printf(
        "schedule ahead      %.1f s in all (the next steps' resumptions and admissions, made "
        "while the GPU computes the step before); all work ahead p99 %.1f us per step (not in "
        "the step's time)\n",
        f.times.schedule_total / 1e6, f.times.ahead_p99);
  }
  std::printf("prompt keys         hashed ahead, off the step: %.1f s in all\n",
              c.hash_ahead_us / 1e6);
  if (const std::string slow = slow_step_profile(f.times); !slow.empty())
    std::printf("slowest 1%% steps   %s\n", slow.c_str());
  if (o.verify && engine != nullptr) {
    std::printf("verify              %llu mismatches, %llu pages checked\n",
                static_cast<ull>(c.mismatches), static_cast<ull>(engine->pages_checked()));
  }
}

// The shared tier's counters: a line of text, and the JSON object.
nlohmann::json report_shared(const SharedTierStats& st, const SimCounters& c) {
  using ull = unsigned long long;
  std::printf(
      "shared tier         %llu objects published (%llu present already), %llu fetched; "
      "%llu tokens brought in; fetches %.2f s\n",
      static_cast<ull>(st.objects_published), static_cast<ull>(st.objects_present),
      static_cast<ull>(st.objects_fetched), static_cast<ull>(st.hit_tokens),
      c.shared_fetch_us / 1e6);
  return shared_stats_json(st);
}

}  // namespace

nlohmann::json shared_stats_json(const SharedTierStats& st) {
  return {{"objects_published", st.objects_published}, {"objects_present", st.objects_present},
          {"objects_dropped", st.objects_dropped},     {"publish_failures", st.publish_failures},
          {"bytes_published", st.bytes_published},     {"hit_tokens", st.hit_tokens},
          {"objects_fetched", st.objects_fetched},     {"bytes_fetched", st.bytes_fetched},
          {"objects_corrupt", st.objects_corrupt},     {"store_failures", st.store_failures},
          {"fetches_skipped", st.fetches_skipped}};
}

int report(const SimOptions& o, const ModelDescription& model,
           const std::vector<TraceRequest>& reqs, HybridCacheManager& h, const SimCounters& c,
           const testing::FakeEngine* engine, double seconds) {
  Figures f;
  f.bound = c.bound_tokens;
  f.times = step_times(c);
  if (h.state_group()) {
    const ReuseStats rs = h.manager().reuse_stats();
    f.snapshot_hits = rs.groups[h.state_group()->value].hits;
    f.snapshot_lookups = rs.groups[h.state_group()->value].lookups;
    f.snapshot_tiers = rs.groups[h.state_group()->value].served_by_tier;
  }
  nlohmann::json j = to_json(o, model, h.plan(), reqs.size(), c, f, engine, seconds);
  print_header(o, model, h, reqs.size());
  print_text(o, h.plan(), reqs.size(), c, f, engine);
  if (!o.shared_redis.empty()) j["shared"] = report_shared(h.manager().shared_stats(), c);
  std::printf("wall time           %.1f s (queued copies drained)\n", seconds);
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) return fail("--json: cannot write '" + o.json + "'");
    out << j.dump(2) << "\n";
    std::printf("JSON report         %s\n", o.json.c_str());
  }
  if (!o.step_times.empty()) {
    if (!write_step_times(o.step_times, c))
      return fail("--step-times: cannot write '" + o.step_times + "'");
    std::printf("step times          %s\n", o.step_times.c_str());
  }
  if (!o.svg.empty()) {
    std::ofstream out(o.svg);
    if (!out) return fail("--svg: cannot write '" + o.svg + "'");
    out << svg_plot(
        c.samples, pool_group_names(h.plan()),
        model.model_type + (o.attention_only ? " (attention only)" : "") + " on " + o.trace);
    std::printf("plot                %s\n", o.svg.c_str());
  }
  std::fflush(stdout);
  return c.mismatches == 0 ? 0 : 1;
}

}  // namespace hybridkv::tools
