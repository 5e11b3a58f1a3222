// Sizing from tokens (DESIGN §3.7). Every answer comes from the same split_tier() that build()
// uses, so a quota from quota_for_tokens() gives a plan that holds those tokens.
#include <algorithm>
#include <cmath>
#include <optional>

#include "plan/plan_internal.h"

namespace hybridkv::plan_detail {

uint64_t usable_slots(uint64_t slots, double util) {
  uint64_t u = static_cast<uint64_t>(std::floor(static_cast<double>(slots) * util));
  while (u > 0 && scale_by_util(u, util) > slots) --u;
  while (scale_by_util(u + 1, util) <= slots) ++u;
  return u;
}

namespace {

struct AttentionCounts {
  uint64_t full = 0;
  uint64_t windowed = 0;
  uint64_t window_slots = 0;  // one request's window and sink blocks, all window groups
};

AttentionCounts count_attention(const StructureView& s, const PoolGroup& pg) {
  AttentionCounts c;
  for (CacheGroupId g : pg.groups) {
    const CacheGroup& group = s.groups[g.value];
    if (group.kind != GroupKind::kAttention) continue;
    if (group.window) {
      ++c.windowed;
      c.window_slots += group.one_request_slots;
    } else {
      ++c.full;
    }
  }
  return c;
}

}  // namespace

std::optional<uint64_t> kv_tokens(const ManagerConfig& config, const StructureView& s,
                                  const std::vector<uint64_t>& slots) {
  bool any_full = false;
  for (const PoolGroup& pg : s.pool_groups) any_full = any_full || count_attention(s, pg).full > 0;
  std::optional<uint64_t> tokens;
  for (const PoolGroup& pg : s.pool_groups) {
    const AttentionCounts c = count_attention(s, pg);
    // With full attention present, windows do not bound the token count.
    const uint64_t groups = any_full ? c.full : c.windowed;
    if (groups == 0) continue;
    const uint64_t blocks = usable_slots(slots[pg.id.value], config.max_util_for_resume) / groups;
    const uint64_t t = blocks * config.tokens_per_block;
    tokens = tokens ? std::min(*tokens, t) : t;
  }
  return tokens;
}

std::optional<uint64_t> longest_request(const ManagerConfig& config, const StructureView& s,
                                        const std::vector<uint64_t>& slots) {
  std::optional<uint64_t> tokens;
  for (const PoolGroup& pg : s.pool_groups) {
    const AttentionCounts c = count_attention(s, pg);
    if (c.full == 0) continue;
    const uint64_t usable = usable_slots(slots[pg.id.value], config.max_util_for_resume);
    const uint64_t blocks = usable > c.window_slots ? (usable - c.window_slots) / c.full : 0;
    const uint64_t t = blocks * config.tokens_per_block;
    tokens = tokens ? std::min(*tokens, t) : t;
  }
  return tokens;
}

std::optional<uint64_t> longest_request_in_batch(const ManagerConfig& config,
                                                 const StructureView& s,
                                                 const std::vector<uint64_t>& slots,
                                                 uint64_t batch) {
  std::optional<uint64_t> tokens;
  for (const PoolGroup& pg : s.pool_groups) {
    const AttentionCounts c = count_attention(s, pg);
    // Slots every request holds whatever its length: window and sink blocks, one state.
    uint64_t fixed = c.window_slots;
    for (CacheGroupId g : pg.groups) fixed += s.groups[g.value].kind == GroupKind::kSsm ? 1 : 0;
    const uint64_t usable = usable_slots(slots[pg.id.value], config.max_util_for_resume);
    if (batch * fixed > usable) return 0;
    if (c.full == 0) continue;
    const uint64_t blocks = (usable - batch * fixed) / (batch * c.full);
    const uint64_t t = blocks * config.tokens_per_block;
    tokens = tokens ? std::min(*tokens, t) : t;
  }
  return tokens;
}

}  // namespace hybridkv::plan_detail

namespace hybridkv {

using plan_detail::Structure;
using plan_detail::StructureView;

std::optional<uint64_t> StoragePlan::gpu_kv_tokens() const {
  const TierPlan* gpu = tier(TierKind::kGpu);
  if (gpu == nullptr) return std::nullopt;
  const plan_detail::StructureView view{groups_, pool_groups_};
  return plan_detail::kv_tokens(config_, view, gpu->slots);
}

std::optional<uint64_t> StoragePlan::max_request_tokens() const {
  const TierPlan* gpu = tier(TierKind::kGpu);
  if (gpu == nullptr) return std::nullopt;
  const plan_detail::StructureView view{groups_, pool_groups_};
  return plan_detail::longest_request(config_, view, gpu->slots);
}

std::optional<uint64_t> StoragePlan::max_request_tokens(uint64_t batch_size) const {
  const TierPlan* gpu = tier(TierKind::kGpu);
  if (gpu == nullptr) return std::nullopt;
  const plan_detail::StructureView view{groups_, pool_groups_};
  return plan_detail::longest_request_in_batch(config_, view, gpu->slots, batch_size);
}

namespace {

// GPU slots of the plan at `quota` exactly as build() computes them (raise included).
std::vector<uint64_t> gpu_slots_at(const ManagerConfig& config, const StructureView& s,
                                   uint64_t quota) {
  uint64_t q = plan_detail::round_to_grain(TierKind::kGpu, quota);
  const uint64_t minimum = plan_detail::minimum_gpu_bytes(s);
  if (q < minimum) q = plan_detail::round_to_grain(TierKind::kGpu, minimum);
  return plan_detail::split_tier(config, s, TierKind::kGpu, q).slots;
}

}  // namespace

Result<std::vector<uint64_t>> estimate_slots(const ManagerConfig& config, TierKind tier,
                                             uint64_t quota_bytes) {
  Result<Structure> s = plan_detail::build_structure(config);
  if (!s) return s.status();
  if (tier == TierKind::kGpu) return gpu_slots_at(config, *s, quota_bytes);
  return plan_detail::split_tier(config, *s, tier, plan_detail::round_to_grain(tier, quota_bytes))
      .slots;
}

Result<uint64_t> minimum_gpu_quota(const ManagerConfig& config) {
  Result<Structure> s = plan_detail::build_structure(config);
  if (!s) return s.status();
  return plan_detail::round_to_grain(TierKind::kGpu, plan_detail::minimum_gpu_bytes(*s));
}

Result<uint64_t> max_tokens_for_quota(const ManagerConfig& config, uint64_t gpu_quota) {
  Result<Structure> s = plan_detail::build_structure(config);
  if (!s) return s.status();
  // Below the minimum the plan would raise the quota: nothing fits in what was asked.
  if (plan_detail::round_to_grain(TierKind::kGpu, gpu_quota) < plan_detail::minimum_gpu_bytes(*s)) {
    return uint64_t{0};
  }
  const std::optional<uint64_t> tokens =
      plan_detail::kv_tokens(config, *s, gpu_slots_at(config, *s, gpu_quota));
  if (!tokens) return Status::invalid("the model has no attention layers: it holds no KV tokens");
  return *tokens;
}

Result<uint64_t> quota_for_tokens(const ManagerConfig& config, uint64_t max_tokens) {
  Result<Structure> s = plan_detail::build_structure(config);
  if (!s) return s.status();
  const uint64_t minimum =
      plan_detail::round_to_grain(TierKind::kGpu, plan_detail::minimum_gpu_bytes(*s));
  auto tokens_at = [&](uint64_t q) {
    return plan_detail::kv_tokens(config, *s, gpu_slots_at(config, *s, q));
  };
  if (!tokens_at(minimum)) {
    return Status::invalid("the model has no attention layers: it holds no KV tokens");
  }
  if (*tokens_at(minimum) >= max_tokens) return minimum;

  // The DESIGN §3.7 estimate (attention bytes per token x tokens + fixed intercepts + window
  // bytes, over util) starts the search; the split decides, so the answer is exact.
  const double util = config.max_util_for_resume;
  long double per_token = 0, intercept = 0;
  for (const PoolGroup& pg : s->pool_groups) {
    for (CacheGroupId g : pg.groups) {
      const CacheGroup& group = s->groups[g.value];
      if (group.kind == GroupKind::kAttention && !group.window) {
        per_token += static_cast<long double>(pg.slot_bytes) / config.tokens_per_block;
      }
    }
    intercept += static_cast<long double>(pg.floor_slots) * pg.slot_bytes;
  }
  constexpr uint64_t kStep = 2ull << 20;  // the smallest GPU grain
  constexpr uint64_t kLimit = 1ull << 60;
  uint64_t hi = static_cast<uint64_t>(
      std::min<long double>((per_token * max_tokens + intercept) / util, kLimit));
  hi = std::max(hi, minimum);
  while (*tokens_at(hi) < max_tokens) {
    if (hi >= kLimit) {
      return Status::invalid("max_tokens " + std::to_string(max_tokens) +
                             " needs more than 2^60 bytes of GPU quota");
    }
    hi = std::min(hi * 2, kLimit);
  }
  uint64_t lo = minimum;  // tokens_at(lo) < max_tokens <= tokens_at(hi)
  while (hi - lo > kStep) {
    const uint64_t mid = lo + (hi - lo) / 2 / kStep * kStep;
    if (*tokens_at(mid) >= max_tokens)
      hi = mid;
    else
      lo = mid;
  }
  return plan_detail::round_to_grain(TierKind::kGpu, hi);
}

Result<uint64_t> clamp_max_seq_len_for_mem(const ManagerConfig& config, uint64_t gpu_quota,
                                           uint64_t max_seq_len) {
  Result<Structure> s = plan_detail::build_structure(config);
  if (!s) return s.status();
  const std::optional<uint64_t> longest =
      plan_detail::longest_request(config, *s, gpu_slots_at(config, *s, gpu_quota));
  return longest ? std::min(*longest, max_seq_len) : max_seq_len;
}

}  // namespace hybridkv
