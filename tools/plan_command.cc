#include "plan_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "hybridkv/hybrid.h"
#include "hybridkv/model.h"
#include "hybridkv/plan.h"
#include "hybridkv/units.h"
#include "plan_report.h"

namespace hybridkv::tools {
namespace {

int fail(const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "hybridkv plan: %s\n", line.c_str());
  return 2;
}

bool parse_quota(const std::string& flag, const std::string& text, uint64_t* out,
                 std::string* error) {
  const Result<uint64_t> v = parse_byte_count(text);
  if (!v) {
    *error = flag + ": " + v.status().message();
    return false;
  }
  *out = *v;
  return true;
}

bool parse_dtype_flag(const std::string& flag, const std::string& text, DType* out,
                      std::string* error) {
  const std::optional<DType> d = parse_dtype(text);
  if (!d) {
    *error = flag + ": unknown dtype '" + text + "' (fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8)";
    return false;
  }
  *out = *d;
  return true;
}

}  // namespace

void add_plan_command(CLI::App& app, PlanOptions& o) {
  CLI::App* plan = app.add_subcommand("plan", "Print the storage plan of a model");
  plan->add_option("--model", o.model, "HuggingFace config.json of the model")->required();
  plan->add_option("--tp", o.tp, "tensor-parallel size (numbers are per rank)");
  plan->add_option("--gpu-quota", o.gpu_quota, "GPU cache quota, e.g. 16GiB");
  plan->add_option("--host-quota", o.host_quota, "pinned host tier quota (none by default)");
  plan->add_option("--disk-quota", o.disk_quota, "disk tier quota (needs --disk-path)");
  plan->add_option("--disk-path", o.disk_path, "directory of the disk tier");
  plan->add_option("--max-batch", o.max_batch, "requests per step (the typical step's size)");
  plan->add_option("--typical-len", o.typical_len, "tokens per request of the typical step");
  plan->add_option("--max-live", o.max_live,
                   "override max_live_kv_caches (0: keep the serving formula's value)");
  plan->add_option("--pp", o.pp, "pipeline-parallel size");
  plan->add_option("--pp-rank", o.pp_rank, "pipeline rank to plan");
  plan->add_option("--spec-tokens", o.spec_tokens, "speculative tokens (replay buffers)");
  plan->add_option("--replay-layout", o.replay_layout, "private or ring (GDN)");
  plan->add_flag("--overlap", o.overlap, "overlap scheduling (doubles living caches)");
  plan->add_option("--disagg-role", o.disagg_role, "both, context or generation");
  plan->add_option("--dummy-slots", o.dummy_slots, "CUDA-graph padding requests");
  plan->add_option("--tokens-per-block", o.tokens_per_block, "tokens per attention page");
  plan->add_option("--max-util", o.max_util, "max_util_for_resume");
  plan->add_flag("--no-block-reuse", o.no_block_reuse, "disable prefix reuse");
  plan->add_flag("--swa-scratch", o.swa_scratch,
                 "SWA scratch: window blocks that go stale within a step share scratch slots");
  plan->add_option("--max-rewind-len", o.max_rewind_len,
                   "tokens at a step's end the engine may rewind (never scratch)");
  plan->add_option(
      "--snapshot-dtype", o.snapshot_dtype,
      "bf16 or fp8_e4m3: SSM snapshots keep fp32 states in that dtype (their own pool group)");
  plan->add_option("--kv-dtype", o.kv_dtype, "KV cache dtype");
  plan->add_option("--conv-dtype", o.conv_dtype, "conv state dtype");
  plan->add_option("--ssm-dtype", o.ssm_dtype,
                   "SSM state dtype (default: the config's, else fp32)");
  plan->add_flag("--json", o.json, "print JSON");
}

namespace {

Result<ServingConfig> serving_from(const PlanOptions& o) {
  ServingConfig serving;
  serving.tokens_per_block = o.tokens_per_block;
  serving.max_util_for_resume = o.max_util;
  serving.enable_block_reuse = !o.no_block_reuse;
  serving.max_batch = o.max_batch;
  serving.pp_size = o.pp;
  serving.pp_rank = o.pp_rank;
  serving.num_spec_tokens = o.spec_tokens;
  serving.overlap_scheduling = o.overlap;
  serving.dummy_slots = o.dummy_slots;
  serving.typical_len = o.typical_len;
  if (o.replay_layout == "private") {
    serving.replay_layout = ReplayLayout::kPrivate;
  } else if (o.replay_layout == "ring") {
    serving.replay_layout = ReplayLayout::kRing;
  } else {
    return Status::invalid("--replay-layout: '" + o.replay_layout + "' is not private or ring");
  }
  if (o.disagg_role == "both") {
    serving.role = DisaggRole::kBoth;
  } else if (o.disagg_role == "context") {
    serving.role = DisaggRole::kContext;
  } else if (o.disagg_role == "generation") {
    serving.role = DisaggRole::kGeneration;
  } else {
    return Status::invalid("--disagg-role: '" + o.disagg_role +
                           "' is not both, context or generation");
  }
  if (o.typical_len == 0) return Status::invalid("--typical-len: 0 must be > 0");
  if (!o.snapshot_dtype.empty()) {
    const std::optional<DType> d = parse_dtype(o.snapshot_dtype);
    if (!d) return Status::invalid("--snapshot-dtype: '" + o.snapshot_dtype + "' is not a dtype");
    serving.snapshot_dtype = d;
  }
  std::string error;
  uint64_t quota = 0;
  serving.tiers.clear();
  if (!parse_quota("--gpu-quota", o.gpu_quota, &quota, &error)) return Status::invalid(error);
  serving.tiers.push_back({TierKind::kGpu, quota, ""});
  if (!o.host_quota.empty()) {
    if (!parse_quota("--host-quota", o.host_quota, &quota, &error)) return Status::invalid(error);
    serving.tiers.push_back({TierKind::kHost, quota, ""});
  }
  if (!o.disk_quota.empty()) {
    if (!parse_quota("--disk-quota", o.disk_quota, &quota, &error)) return Status::invalid(error);
    if (o.disk_path.empty()) return Status::invalid("--disk-quota needs --disk-path");
    serving.tiers.push_back({TierKind::kDisk, quota, o.disk_path});
  }
  return serving;
}

Result<StoragePlan> build_plan(const ModelDescription& model, const ServingConfig& serving,
                               const PlanOptions& o) {
  Result<ManagerConfig> hybrid = hybrid_manager_config(model, serving);
  if (!hybrid) return hybrid.status();
  ManagerConfig config = std::move(hybrid).value();
  if (o.max_live) config.max_live_kv_caches = o.max_live;
  config.swa_scratch_reuse = o.swa_scratch;
  config.max_rewind_len = o.max_rewind_len;
  return StoragePlan::build(config);
}

// One row per pipeline rank (each planned as --pp-rank would plan it).
Result<std::vector<RankBytes>> every_rank(const ModelDescription& model, ServingConfig serving,
                                          const PlanOptions& o) {
  std::vector<RankBytes> rows;
  for (uint32_t r = 0; r < o.pp; ++r) {
    serving.pp_rank = r;
    Result<StoragePlan> plan = build_plan(model, serving, o);
    if (!plan)
      return Status::invalid("pp rank " + std::to_string(r) + ": " + plan.status().message());
    rows.push_back(rank_bytes(r, *plan));
  }
  return rows;
}

}  // namespace

int run_plan_command(const PlanOptions& o) {
  std::string error;
  ModelOptions mo;
  mo.tp_size = o.tp;
  if (o.tp == 0) return fail("--tp: 0 must be > 0");
  if (!parse_dtype_flag("--kv-dtype", o.kv_dtype, &mo.kv_dtype, &error)) return fail(error);
  if (!parse_dtype_flag("--conv-dtype", o.conv_dtype, &mo.conv_dtype, &error)) return fail(error);
  if (!o.ssm_dtype.empty()) {
    DType d;
    if (!parse_dtype_flag("--ssm-dtype", o.ssm_dtype, &d, &error)) return fail(error);
    mo.ssm_dtype = d;
  }
  Result<ServingConfig> serving = serving_from(o);
  if (!serving) return fail(serving.status().message());
  Result<ModelDescription> model = read_model_config(o.model, mo);
  if (!model) return fail(model.status().message());
  Result<StoragePlan> plan = build_plan(*model, *serving, o);
  if (!plan) return fail(plan.status().message());
  Result<std::vector<RankBytes>> ranks = every_rank(*model, *serving, o);
  if (!ranks) return fail(ranks.status().message());
  if (o.json) {
    nlohmann::json j = plan_to_json(*model, *plan);
    j["ranks"] = ranks_to_json(*ranks, o.tp);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << plan_to_text(*model, *plan);
    if (o.tp * o.pp > 1) std::cout << ranks_to_text(*ranks, o.tp);  // a layout of several ranks
  }
  return 0;
}

}  // namespace hybridkv::tools
