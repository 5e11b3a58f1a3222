// The manager CPU time of `hybridkv sim`'s steps (sim_step_times.cc): the summary of the
// report, the slow-step profile and --step-times. Internal to the tools.
#pragma once

#include <array>
#include <string>

#include "sim_internal.h"

namespace hybridkv::tools {

// A step over this is visible in an engine's inter-token latency (issue 35's bound on the p99).
constexpr double kSlowStepUs = 100;

struct StepTimes {
  double median = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
  double over_slow = 0;  // share of steps over kSlowStepUs
  // Work while the GPU computes (off the steps' path): evict_ahead alone, and all of it
  // (admit_ahead, touch_queued, the work after the launch and the scheduling ahead too).
  double evict_p99 = 0, evict_total = 0, admit_total = 0, touch_total = 0, ahead_p99 = 0;
  double after_total = 0, after_p99 = 0;  // --after-launch: commits, frees, rebalancing
  double schedule_total = 0;  // --schedule-ahead: the next steps' resumptions and admissions
  // The steps at or above the p99: how many, and their time by call (SimOp).
  uint64_t slow_steps = 0;
  std::array<double, kSimOps> slow_ops_us{};
  uint64_t slow_evictions = 0;  // pages the slow steps' own calls evicted
  // The steps the OS took the core in (another process ran: their time is not the manager's),
  // and the figures of the others.
  uint64_t descheduled = 0;
  double undisturbed_median = 0, undisturbed_p99 = 0, undisturbed_over_slow = 0;
};

// The calling thread's involuntary context switches so far (getrusage, RUSAGE_THREAD).
uint64_t involuntary_switches();

StepTimes step_times(const SimCounters& c);
// step,total_us,<one column per call>,evicted_pages,descheduled: every step's manager CPU time,
// the pages its own calls evicted, and whether the OS took the core during it (1).
bool write_step_times(const std::string& path, const SimCounters& c);
// "resize 61 %, add_request 30 %, ... (N steps, ...)" (largest first), or "".
std::string slow_step_profile(const StepTimes& t);

}  // namespace hybridkv::tools
