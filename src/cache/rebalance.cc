// One budget per tier: the manager's side of rebalancing (ManagerConfig::policies.rebalance).
// What a tier looks like goes to the policy (cache/rebalance_policy.h; the shipped rule is in
// pressure_rebalance.cc); its answer is checked against every constraint and applied, or the
// step changes nothing.
#include <algorithm>

#include "cache/manager_core.h"
#include "cache/rebalance_policy.h"

namespace hybridkv::cache_detail {

std::vector<bool> rebalanced_pool_groups(const StoragePlan& plan) {
  std::vector<bool> rebalanced(plan.pool_groups().size(), false);
  for (const CacheGroup& g : plan.cache_groups()) {
    const PoolGroup& pg = plan.pool_group(g.pool_group);
    if (g.policy != ReusePolicy::kPrivate && !pg.fixed_private && !pg.live_floor)
      rebalanced[pg.id.value] = true;
    if (g.snapshot_pool_group) rebalanced[g.snapshot_pool_group->value] = true;
  }
  return rebalanced;
}

std::optional<std::vector<uint64_t>> MemoryControl::rebalance_target(storage::TierIndex t) const {
  const TierPlan& tp = core_.plan_.tiers()[t.value];
  std::vector<PoolPressure> pools;
  pools.reserve(core_.plan_.pool_groups().size());
  for (const PoolGroup& pg : core_.plan_.pool_groups()) {
    const storage::Storage::SlotCounts c = core_.storage_.counts(t, pg.id);
    pools.push_back({pg.id, c.total, pg.slot_bytes, c.free,
                     tp.kind == TierKind::kGpu ? pg.floor_slots : 0, /*age=*/0,
                     core_.storage_.victims(t, pg.id), core_.storage_.wants(t, pg.id),
                     core_.storage_.ever_full(t, pg.id), rebalanced_[pg.id.value]});
  }
  if (!rebalancer_->pressed(pools)) return std::nullopt;
  for (PoolPressure& p : pools) p.age = core_.storage_.pressure_age(t, p.id);
  return rebalancer_->target(quotas_[t.value], pools);
}

bool MemoryControl::need_adjustment() const {
  std::shared_lock lock(core_.mu_);
  if (rebalancer_ == nullptr) return false;
  for (uint32_t t = 0; t < core_.plan_.tiers().size(); ++t) {
    if (rebalance_target(storage::TierIndex(t))) return true;
  }
  return false;
}

Result<bool> MemoryControl::adjust() {
  std::unique_lock lock(core_.mu_);
  if (rebalancer_ == nullptr) {
    return Status(StatusCode::kFailedPrecondition,
                  "adjust: pool rebalancing is off (ManagerConfig::policies.rebalance)");
  }
  bool changed = false;
  for (uint32_t i = 0; i < core_.plan_.tiers().size(); ++i) {
    const storage::TierIndex t(i);
    const std::optional<std::vector<uint64_t>> want = rebalance_target(t);
    if (!want) continue;
    core_.storage_.reset_victims(t);
    if (!check_slots(t, *want, "adjust").is_ok()) continue;
    if (!apply_slots(t, *want).is_ok()) continue;  // the backend could not back the growth
    changed = true;
  }
  core_.after_mutation();
  return changed;
}

}  // namespace hybridkv::cache_detail
