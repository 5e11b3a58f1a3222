// The pieces of `hybridkv sim`: the scheduler loop and the report (see sim.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hybridkv/hybrid.h"
#include "hybridkv/testing/fake_engine.h"
#include "sim.h"
#include "trace.h"

namespace hybridkv::tools {

// A point of the plot, after a step: tokens reused so far, what unlimited memory would have
// reused of the same admitted prompts (the bound), and each pool group's share of its GPU slots
// in use.
struct Sample {
  uint64_t step = 0;
  uint64_t reused = 0;
  uint64_t bound = 0;
  std::vector<double> gpu_used;  // by pool group
};

// The manager calls a step's CPU time is spent in (the slow-step profile of the report).
enum SimOp : uint8_t {
  kOpAdd,
  kOpResume,
  kOpSuspend,
  kOpFree,
  kOpCommit,
  kOpResize,
  kOpAdjust,
  kOpCanResume,
  kOpEvictAhead,  // from here on: off the step's critical path, not in its total
  kOpAdmitAhead,
  kOpTouch,
  kOpCommitAfter,  // --after-launch: the step's commits, frees and rebalancing, while the GPU
  kOpFreeAfter,    // computes it
  kOpAdjustAfter,
  kOpScheduleAhead,  // --schedule-ahead: the next step's resumptions and admissions
  kSimOps
};
// Column names of --step-times.
inline constexpr const char* kSimOpKeys[kSimOps] = {"add_request",
                                                    "resume",
                                                    "suspend",
                                                    "free",
                                                    "commit",
                                                    "resize",
                                                    "rebalance",
                                                    "can_resume",
                                                    "evict_ahead",
                                                    "admit_ahead",
                                                    "touch_ahead",
                                                    "commit_after_launch",
                                                    "free_after_launch",
                                                    "rebalance_after_launch",
                                                    "schedule_ahead"};
inline constexpr const char* kSimOpNames[kSimOps] = {"add_request (hash, match)",
                                                     "resume",
                                                     "suspend",
                                                     "free_request / commit_answer",
                                                     "commit_at_snapshot",
                                                     "resize",
                                                     "rebalance (need_adjustment, adjust)",
                                                     "can_resume (before a resume)",
                                                     "evict_ahead (while the GPU computes)",
                                                     "admit_ahead (while the GPU computes)",
                                                     "touch_queued (while the GPU computes)",
                                                     "commit_at_snapshot after the launch",
                                                     "free_request after the launch",
                                                     "rebalance after the launch",
                                                     "resumptions and admissions scheduled ahead"};

// What a run counted.
struct SimCounters {
  uint64_t steps = 0;
  uint64_t prompt_tokens = 0;
  uint64_t reused_tokens = 0;
  // Where the rest of the first admissions' matches went (ReuseMatch): tokens found in the tree,
  // then covered by KV, then the part of the snapshot shortfall a dropped snapshot caused.
  uint64_t tree_tokens = 0;
  uint64_t kv_tokens = 0;
  uint64_t dropped_snapshot_tokens = 0;
  uint64_t suspends = 0;           // preemptions that kept the request's pages (swap)
  uint64_t resumes = 0;            // ... and their resumes (never more than suspends)
  uint64_t recomputes = 0;         // preemptions that freed the request (it is recomputed)
  uint64_t failed_admissions = 0;  // new requests that could not resume yet (tried again)
  uint64_t onboard_waits = 0;  // resumptions put off while their pages come up (--onboard-in-step)
  // Requests that joined the running batch (admitted or resumed) and computed no prefill token
  // in that step (its token budget was spent): they hold memory a step early.
  uint64_t idle_joins = 0;
  uint64_t most_joins = 0;       // the most requests that joined in one step
  uint64_t skipped = 0;          // requests longer than one request can be on the GPU
  uint64_t skipped_longest = 0;  // tokens of the longest skipped request
  uint64_t bound_tokens = 0;     // the reuse bound of the admitted requests
  uint64_t mismatches = 0;
  uint64_t bytes_offloaded = 0;
  uint64_t bytes_onboarded = 0;
  uint64_t bytes_offload_cancelled = 0;        // offloads whose page died before the copy ran
  uint64_t bytes_copies_kept = 0;              // colder slots kept as copies by onboards
  std::vector<TierIterationStats> tier_moves;  // by tier index, summed over the run
  uint64_t pages_dropped = 0;
  uint64_t device_copies = 0;
  uint64_t adjustments = 0;                      // rebalancing steps taken
  std::vector<std::vector<uint64_t>> end_slots;  // per tier, per pool group: slots at the end
  std::vector<double> step_us;                   // manager CPU time per step (critical path)
  std::vector<std::array<float, kSimOps>> step_ops_us;  // ... by call (SimOp)
  // Pages the step's own calls evicted (moved down a tier, back to a kept copy, or dropped):
  // the room --evict-ahead did not make in time.
  std::vector<uint32_t> step_evictions;
  // Steps in which the OS took the core from the sim (involuntary context switches): their
  // wall time counts another process's work, so the figures are also given without them.
  std::vector<bool> step_descheduled;
  double shared_fetch_us = 0;       // wall time of the shared-tier fetches (store round trips)
  uint64_t pages_prefetched = 0;    // --admit-ahead: pages onboarded ahead of their resume
  uint64_t created_ahead = 0;       // requests created (prompt matched) while the GPU computes
  uint64_t most_created_ahead = 0;  // the most waiting created at once
  double hash_ahead_us = 0;         // prompts' block keys, hashed off the step (hash_prompt)
  std::vector<uint64_t> peak;       // peak GPU slots per pool group
  std::vector<Sample> samples;
  std::string error;  // set when the run stopped early
};

// GB/s of a link to a colder tier: pages going down, coming up.
struct LinkRate {
  double down = 0;
  double up = 0;
};
// Parses "DOWN,UP" (GB/s, both > 0); the error names `flag` and the text.
Result<LinkRate> parse_link(const char* flag, const std::string& text);

class Scheduler;
// The scheduler loop over a trace, one iteration at a time (a fleet ticks its instances in
// turn); `engine` (may be null) writes and checks pages; `bound` is reuse_bound(requests).
class SchedulerRun {
 public:
  SchedulerRun(const SimOptions& options, const std::vector<TraceRequest>& requests,
               const std::vector<uint64_t>& bound, HybridCacheManager& manager,
               testing::FakeEngine* engine);
  ~SchedulerRun();
  bool tick();  // false once every request finished (or an error stopped the run)
  SimCounters finish();

 private:
  std::unique_ptr<Scheduler> s_;
};

// The whole loop at once.
SimCounters run_scheduler(const SimOptions& options, const std::vector<TraceRequest>& requests,
                          const std::vector<uint64_t>& bound, HybridCacheManager& manager,
                          testing::FakeEngine* engine);

// Prints the report and writes --json / --svg; returns the exit code.
int report(const SimOptions& options, const ModelDescription& model,
           const std::vector<TraceRequest>& requests, HybridCacheManager& manager,
           const SimCounters& counters, const testing::FakeEngine* engine, double seconds);

// The --svg plot (sim_plot.cc).
std::string svg_plot(const std::vector<Sample>& samples,
                     const std::vector<std::string>& pool_group_names, const std::string& title);

// The shared tier (sim_shared.cc): --instance K/N, the requests of instance K (index % N == K),
// and --shared-redis into the serving config (the error names the flag).
Result<std::pair<uint32_t, uint32_t>> parse_instance(const std::string& text);
std::vector<TraceRequest> instance_share(const std::vector<TraceRequest>& trace, uint32_t k,
                                         uint32_t n);
Status add_shared_tier(const SimOptions& options, ServingConfig& serving);

// The fleet (sim_fleet.cc): --instances N --router --shared-quota. `make` builds one instance's
// manager for its share of the trace.
using ManagerFactory = std::function<Result<std::unique_ptr<HybridCacheManager>>(
    const ServingConfig& serving, const std::vector<TraceRequest>& share)>;
Status check_fleet_options(const SimOptions& options);
int run_fleet(const SimOptions& options, ServingConfig serving,
              const std::vector<TraceRequest>& trace, const ManagerFactory& make);

// A manager's SharedTierStats as the report's JSON object (sim_report.cc).
nlohmann::json shared_stats_json(const SharedTierStats& stats);

// "hybridkv sim: <message>" on stderr; returns 2.
int fail(const std::string& message);

}  // namespace hybridkv::tools
