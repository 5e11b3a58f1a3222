// `hybridkv plan`: prints the storage plan of a model.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace hybridkv::tools {

struct PlanOptions {
  std::string model;
  uint32_t tp = 1;
  std::string gpu_quota = "16GiB";
  std::string host_quota;
  std::string disk_quota;
  std::string disk_path;
  uint32_t max_batch = 0;       // 0: the default typical step
  uint64_t typical_len = 2048;  // tokens per request of the typical step
  uint32_t max_live = 0;        // 0: unset
  uint32_t tokens_per_block = 32;
  double max_util = 0.97;
  bool no_block_reuse = false;
  std::string kv_dtype = "bf16";
  std::string conv_dtype = "bf16";
  std::string ssm_dtype;  // empty: from the config, else fp32
  bool json = false;
};

void add_plan_command(CLI::App& app, PlanOptions& options);
// Runs the command; returns the exit code (0, or 2 on bad input with one line on stderr).
int run_plan_command(const PlanOptions& options);

}  // namespace hybridkv::tools
