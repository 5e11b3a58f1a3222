// `hybridkv plan`: prints the storage plan of a model.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace hybridkv::tools {

struct PlanOptions {
  std::string model;
  uint32_t tp = 1;
  std::string gpu_quota = "16GiB";
  std::string host_quota;
  std::string disk_quota;
  std::string disk_path;
  uint32_t max_batch = 64;  // requests per step (the typical step's size)
  uint32_t pp = 1;
  uint32_t pp_rank = 0;
  uint32_t spec_tokens = 0;
  std::string replay_layout = "private";
  bool overlap = false;
  std::string disagg_role = "both";
  uint32_t dummy_slots = 0;
  uint64_t typical_len = 2048;  // tokens per request of the typical step
  uint32_t max_live = 0;        // 0: unset
  uint32_t tokens_per_block = 32;
  double max_util = 0.97;
  bool no_block_reuse = false;
  std::string snapshot_dtype;  // empty: snapshots keep the states' dtypes
  bool swa_scratch = false;
  int64_t max_rewind_len = 0;
  std::string kv_dtype = "bf16";
  std::string conv_dtype = "bf16";
  std::string ssm_dtype;  // empty: from the config, else fp32
  bool json = false;
};

void add_plan_command(CLI::App& app, PlanOptions& options);
// Runs the command; returns the exit code (0, or 2 on bad input with one line on stderr).
int run_plan_command(const PlanOptions& options);

}  // namespace hybridkv::tools
