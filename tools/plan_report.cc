#include "plan_report.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "hybridkv/units.h"

namespace hybridkv::tools {
namespace {

// The prefill chunk the plan shows SWA scratch for.
constexpr uint64_t kScratchExampleTokens = 8192;

// SWA scratch of one window group for a kScratchExampleTokens-token prefill from 0.
struct ScratchExample {
  uint64_t blocks = 0;  // scratch blocks
  uint64_t slots = 0;   // scratch slots they take
};
ScratchExample scratch_example(const StoragePlan& plan, const CacheGroup& g) {
  const ManagerConfig& c = plan.config();
  if (!c.swa_scratch_reuse || !g.window) return {};
  const auto [begin, end] = g.scratch_blocks(
      kScratchExampleTokens, 0, static_cast<uint64_t>(c.max_rewind_len), c.tokens_per_block);
  return {end - begin, g.scratch_slots(end - begin)};
}

using nlohmann::json;

std::string group_label(const CacheGroup& g) {
  std::string s = g.kind == GroupKind::kSsm
                      ? "SSM"
                      : (g.window ? "window " + std::to_string(*g.window) : "full attention");
  if (g.sink_blocks) s += " + " + std::to_string(g.sink_blocks) + " sink blocks";
  return s + " " + reuse_policy_name(g.policy);
}

std::string floor_text(const PoolGroup& pg) {
  std::string s;
  for (const FloorReason& r : pg.floor_reasons) {
    if (!s.empty()) s += ", ";
    s += r.what + ": " + std::to_string(r.slots);
  }
  return s;
}

std::string with_commas(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

json model_json(const ModelDescription& model) {
  return {
      {"source", model.source},
      {"model_type", model.model_type},
      {"family", model.family},
      {"model_layers", model.num_model_layers},
      {"attention_layers", model.num_attention_layers()},
      {"recurrent_layers", model.num_recurrent_layers()},
      {"tp", model.tp_size},
      {"kv_dtype", dtype_name(model.kv_dtype)},
      {"ssm_dtype", dtype_name(model.ssm_dtype)},
      {"conv_dtype", dtype_name(model.conv_dtype)},
      {"kv_bytes_per_token", model.kv_bytes_per_token()},
      {"full_kv_bytes_per_token", model.full_kv_bytes_per_token()},
      {"sliding_kv_bytes_per_token", model.sliding_kv_bytes_per_token()},
      {"state_bytes_per_sequence", model.state_bytes_per_sequence()},
      {"ssm_bytes_per_sequence", model.ssm_bytes_per_sequence()},
      {"conv_bytes_per_sequence", model.conv_bytes_per_sequence()},
  };
}

json groups_json(const StoragePlan& plan) {
  json groups = json::array();
  for (const CacheGroup& g : plan.cache_groups()) {
    json buffers = json::array();
    for (uint32_t b : g.buffers) {
      const PlannedBuffer& pb = plan.buffers()[b];
      buffers.push_back({{"layer", pb.layer},
                         {"role", pb.role},
                         {"pool", pb.pool},
                         {"offset", pb.offset},
                         {"size", pb.size},
                         {"dtype", pb.dtype ? json(dtype_name(*pb.dtype)) : json()}});
    }
    groups.push_back({{"id", g.id.value},
                      {"kind", g.kind == GroupKind::kSsm ? "ssm" : "attention"},
                      {"policy", reuse_policy_name(g.policy)},
                      {"window", g.window ? json(*g.window) : json()},
                      {"sink_blocks", g.sink_blocks},
                      {"layers", g.layers},
                      {"pool_group", g.pool_group.value},
                      {"slot_sizes", g.slot_sizes},
                      {"one_request_slots", g.one_request_slots},
                      {"buffers", buffers}});
    if (plan.config().swa_scratch_reuse && g.window) {
      const ScratchExample e = scratch_example(plan, g);
      json pools = json::array();
      for (const ScratchPool& p : g.scratch)
        pools.push_back(
            {{"pages_per_block", p.pages_per_block}, {"pages_per_slot", p.pages_per_slot}});
      groups.back()["swa_scratch"] = {{"pools", pools},
                                      {"prefill_tokens", kScratchExampleTokens},
                                      {"scratch_blocks", e.blocks},
                                      {"scratch_slots", e.slots}};
    }
  }
  return groups;
}

json pool_groups_json(const StoragePlan& plan) {
  json pools = json::array();
  for (const PoolGroup& pg : plan.pool_groups()) {
    json reasons = json::array();
    for (const FloorReason& r : pg.floor_reasons)
      reasons.push_back({{"why", r.what}, {"slots", r.slots}});
    json plist = json::array();
    for (const Pool& p : pg.pools) {
      plist.push_back({{"buffer_size", p.buffer_size},
                       {"buffers", p.num_buffers},
                       {"slot_bytes", p.slot_bytes}});
    }
    std::vector<uint32_t> members;
    for (CacheGroupId g : pg.groups) members.push_back(g.value);
    pools.push_back({{"id", pg.id.value},
                     {"cache_groups", members},
                     {"pools", plist},
                     {"slot_bytes", pg.slot_bytes},
                     {"fixed_private", pg.fixed_private},
                     {"live_floor", pg.live_floor},
                     {"floor_slots", pg.floor_slots},
                     {"floor_reasons", reasons}});
  }
  return pools;
}

json tiers_json(const StoragePlan& plan) {
  json tiers = json::array();
  for (const TierPlan& t : plan.tiers()) {
    json slots = json::array();
    for (const PoolGroup& pg : plan.pool_groups()) {
      slots.push_back({{"pool_group", pg.id.value},
                       {"slots", t.slots[pg.id.value]},
                       {"bytes", t.slots[pg.id.value] * pg.slot_bytes}});
    }
    tiers.push_back({{"kind", tier_kind_name(t.kind)},
                     {"requested_quota", t.requested_quota},
                     {"quota", t.quota},
                     {"grain", t.grain},
                     {"quota_raised", t.quota_raised},
                     {"bytes_used", t.bytes_used},
                     {"unassigned_bytes", t.unassigned_bytes},
                     {"pool_groups", slots}});
  }
  return tiers;
}

}  // namespace

json plan_to_json(const ModelDescription& model, const StoragePlan& plan) {
  const ManagerConfig& c = plan.config();
  json j;
  j["model"] = model_json(model);
  j["config"] = {
      {"tokens_per_block", c.tokens_per_block},
      {"max_util_for_resume", c.max_util_for_resume},
      {"enable_block_reuse", c.enable_block_reuse},
      {"max_live_kv_caches", c.max_live_kv_caches ? json(*c.max_live_kv_caches) : json()}};
  j["cache_groups"] = groups_json(plan);
  j["pool_groups"] = pool_groups_json(plan);
  j["tiers"] = tiers_json(plan);
  const std::optional<uint64_t> tokens = plan.gpu_kv_tokens();
  const std::optional<uint64_t> longest = plan.max_request_tokens();
  j["gpu_kv_tokens"] = tokens ? json(*tokens) : json();
  j["max_request_tokens"] = longest ? json(*longest) : json();
  j["notes"] = plan.notes();
  return j;
}

// The cache groups: kind, layers, roles with their page sizes, SWA scratch.
static void write_cache_groups(std::ostream& os, const StoragePlan& plan) {
  const ManagerConfig& c = plan.config();
  os << "\n\ncache groups\n";
  for (const CacheGroup& g : plan.cache_groups()) {
    os << "  [" << g.id.value << "] " << group_label(g) << ": " << g.layers.size()
       << " layers, pool group " << g.pool_group.value << ", slot " << g.slot_sizes.size()
       << " pools\n";
    // Roles with their per-page size, once per (role, size).
    std::vector<std::pair<std::string, uint64_t>> seen;
    std::vector<uint32_t> counts;
    for (uint32_t b : g.buffers) {
      const PlannedBuffer& pb = plan.buffers()[b];
      bool found = false;
      for (size_t i = 0; i < seen.size(); ++i) {
        if (seen[i].first == pb.role && seen[i].second == pb.size) {
          ++counts[i];
          found = true;
        }
      }
      if (!found) {
        seen.push_back({pb.role, pb.size});
        counts.push_back(1);
      }
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      os << "        " << seen[i].first << ": " << with_commas(seen[i].second) << " B x "
         << counts[i] << " layers\n";
    }
    if (c.swa_scratch_reuse && g.window) {
      const ScratchExample e = scratch_example(plan, g);
      os << "        swa scratch: a " << with_commas(kScratchExampleTokens)
         << "-token prefill maps " << with_commas(e.blocks) << " stale blocks onto " << e.slots
         << " scratch slots (max_rewind_len " << c.max_rewind_len << ")\n";
    }
  }
}

std::string plan_to_text(const ModelDescription& model, const StoragePlan& plan) {
  std::ostringstream os;
  const ManagerConfig& c = plan.config();
  os << "model     " << model.source << "  (" << model.model_type << ", " << model.family << ")\n"
     << "          " << model.num_model_layers << " model layers -> "
     << model.num_attention_layers() << " attention + " << model.num_recurrent_layers()
     << " recurrent cache layers; TP " << model.tp_size << "; KV " << dtype_name(model.kv_dtype)
     << ", SSM " << dtype_name(model.ssm_dtype) << ", conv " << dtype_name(model.conv_dtype) << "\n"
     << "KV        " << with_commas(model.kv_bytes_per_token()) << " B/token (full "
     << with_commas(model.full_kv_bytes_per_token()) << ", sliding "
     << with_commas(model.sliding_kv_bytes_per_token()) << ")\n"
     << "state     " << with_commas(model.state_bytes_per_sequence()) << " B/sequence ("
     << format_bytes(model.state_bytes_per_sequence()) << "; SSM "
     << with_commas(model.ssm_bytes_per_sequence()) << ", conv "
     << with_commas(model.conv_bytes_per_sequence()) << ")\n"
     << "settings  tokens_per_block " << c.tokens_per_block << ", max_util_for_resume "
     << c.max_util_for_resume << ", block reuse " << (c.enable_block_reuse ? "on" : "off");
  if (c.max_live_kv_caches) os << ", max_live_kv_caches " << *c.max_live_kv_caches;
  write_cache_groups(os, plan);
  os << "\npool groups\n";
  for (const PoolGroup& pg : plan.pool_groups()) {
    os << "  [" << pg.id.value << "] cache groups";
    for (CacheGroupId g : pg.groups) os << " " << g.value;
    os << ": slot " << format_bytes(pg.slot_bytes) << " (" << with_commas(pg.slot_bytes) << " B, "
       << pg.pools.size() << " pools)";
    if (pg.fixed_private) os << ", fixed PRIVATE pool";
    if (pg.snapshots_of) {
      os << ", " << dtype_name(*c.snapshot_dtype) << " snapshots of cache group "
         << pg.snapshots_of->value << " (live states stay in pool group "
         << plan.cache_group(*pg.snapshots_of).pool_group.value << ")";
    }
    if (pg.live_floor) os << ", held at the live floor";
    os << "\n        floor " << pg.floor_slots << " GPU slots = ceil(max(" << floor_text(pg)
       << ") / " << c.max_util_for_resume << ")\n";
    const bool states = std::any_of(pg.groups.begin(), pg.groups.end(), [&](CacheGroupId g) {
      return plan.cache_group(g).kind == GroupKind::kSsm;
    });
    if (states) {
      os << "        state floor: " << pg.floor_slots
         << " GPU slots, a state for every ACTIVE request of the largest batch declared\n";
    }
  }
  os << "\ntiers\n";
  for (const TierPlan& t : plan.tiers()) {
    os << "  " << tier_kind_name(t.kind) << "  quota " << format_bytes(t.quota);
    if (t.quota != t.requested_quota) os << " (asked " << format_bytes(t.requested_quota) << ")";
    os << ", grain " << format_bytes(t.grain) << ", used " << format_bytes(t.bytes_used)
       << ", unassigned " << with_commas(t.unassigned_bytes) << " B\n";
    for (const PoolGroup& pg : plan.pool_groups()) {
      os << "        pool group " << pg.id.value << ": " << with_commas(t.slots[pg.id.value])
         << " slots, " << format_bytes(t.slots[pg.id.value] * pg.slot_bytes) << "\n";
    }
  }
  const std::optional<uint64_t> tokens = plan.gpu_kv_tokens();
  const std::optional<uint64_t> longest = plan.max_request_tokens();
  os << "\nKV tokens on GPU at max_util_for_resume: "
     << (tokens ? with_commas(*tokens) : std::string("no attention layers")) << "\n";
  os << "longest single request: "
     << (longest ? with_commas(*longest) + " tokens" : std::string("not bounded by full attention"))
     << "\n";
  for (const std::string& note : plan.notes()) os << "note: " << note << "\n";
  return os.str();
}

RankBytes rank_bytes(uint32_t pp_rank, const StoragePlan& plan) {
  RankBytes r;
  r.pp_rank = pp_rank;
  const uint32_t tpb = plan.config().tokens_per_block;
  for (const CacheGroup& g : plan.cache_groups()) {
    const uint64_t page = plan.pool_group(g.pool_group).slot_bytes;
    if (g.kind == GroupKind::kSsm) {
      if (g.policy == ReusePolicy::kPrivate) continue;  // replay rows: not a state
      r.recurrent_layers += g.layers.size();
      r.state_bytes_per_sequence += page;
    } else {
      r.attention_layers += g.layers.size();
      r.kv_bytes_per_token += page / tpb;
    }
  }
  for (const TierPlan& t : plan.tiers()) {
    uint64_t& bytes = t.kind == TierKind::kGpu ? r.gpu_bytes : r.host_bytes;
    if (t.kind != TierKind::kDisk) bytes += t.bytes_used;
  }
  return r;
}

std::string ranks_to_text(const std::vector<RankBytes>& ranks, uint32_t tp) {
  std::ostringstream os;
  os << "\nranks (TP " << tp << " x PP " << ranks.size()
     << "; each TP rank of a pipeline rank holds the row's bytes)\n"
     << "  pp rank  layers (attention+recurrent)    KV B/token  state B/sequence   GPU pools  "
        "HOST pools\n";
  uint64_t kv = 0, state = 0, gpu = 0, host = 0;
  for (const RankBytes& r : ranks) {
    const std::string layers =
        std::to_string(r.attention_layers) + "+" + std::to_string(r.recurrent_layers);
    os << "  " << std::left << std::setw(9) << r.pp_rank << std::setw(28) << layers << std::right
       << std::setw(12) << with_commas(r.kv_bytes_per_token) << std::setw(18)
       << with_commas(r.state_bytes_per_sequence) << std::setw(12) << format_bytes(r.gpu_bytes)
       << std::setw(12) << format_bytes(r.host_bytes) << "\n";
    kv += r.kv_bytes_per_token * tp;
    state += r.state_bytes_per_sequence * tp;
    gpu += r.gpu_bytes * tp;
    host += r.host_bytes * tp;
  }
  os << "  all " << ranks.size() * tp << " ranks: KV " << with_commas(kv) << " B/token, state "
     << with_commas(state) << " B/sequence, GPU pools " << format_bytes(gpu) << ", HOST pools "
     << format_bytes(host) << "\n";
  return os.str();
}

nlohmann::json ranks_to_json(const std::vector<RankBytes>& ranks, uint32_t tp) {
  nlohmann::json rows = nlohmann::json::array();
  for (const RankBytes& r : ranks) {
    rows.push_back({{"pp_rank", r.pp_rank},
                    {"tp_ranks", tp},
                    {"attention_layers", r.attention_layers},
                    {"recurrent_layers", r.recurrent_layers},
                    {"kv_bytes_per_token", r.kv_bytes_per_token},
                    {"state_bytes_per_sequence", r.state_bytes_per_sequence},
                    {"gpu_bytes", r.gpu_bytes},
                    {"host_bytes", r.host_bytes}});
  }
  return rows;
}

}  // namespace hybridkv::tools
