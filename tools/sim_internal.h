// The pieces of `hybridkv sim`: the scheduler loop and the report (see sim.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hybridkv/hybrid.h"
#include "hybridkv/testing/fake_engine.h"
#include "sim.h"
#include "trace.h"

namespace hybridkv::tools {

// A point of the plot: reuse so far and GPU use after a step.
struct Sample {
  uint64_t step;
  double reuse_share;
  double gpu_used;
};

// What a run counted.
struct SimCounters {
  uint64_t steps = 0;
  uint64_t prompt_tokens = 0;
  uint64_t reused_tokens = 0;
  uint64_t suspends = 0;
  uint64_t resumes = 0;
  uint64_t mismatches = 0;
  uint64_t bytes_offloaded = 0;
  uint64_t bytes_onboarded = 0;
  uint64_t pages_dropped = 0;
  uint64_t device_copies = 0;
  std::vector<double> step_us;  // manager CPU time per step
  std::vector<uint64_t> peak;   // peak GPU slots per pool group
  std::vector<Sample> samples;
  std::string error;  // set when the run stopped early
};

// Runs the scheduler loop over the trace; `engine` (may be null) writes and checks pages.
SimCounters run_scheduler(const SimOptions& options, const std::vector<TraceRequest>& requests,
                          HybridCacheManager& manager, testing::FakeEngine* engine);

// Prints the report and writes --json / --svg; returns the exit code.
int report(const SimOptions& options, const ModelDescription& model,
           const std::vector<TraceRequest>& requests, HybridCacheManager& manager,
           const SimCounters& counters, const testing::FakeEngine* engine, double seconds);

// "hybridkv sim: <message>" on stderr; returns 2.
int fail(const std::string& message);

}  // namespace hybridkv::tools
