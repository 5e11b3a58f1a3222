// One budget per tier (issue 12 item 3): with ManagerConfig::pool_rebalance the pool groups of
// a tier trade slots while serving, so that no fixed split (the typical step's) decides how many
// snapshots and how many KV pages are kept.
//
// The rule is one LRU over the tier's bytes: under it, the next victim of every pool group would
// have waited equally long. Storage::pressure_age measures that wait, weighted by the victim's
// age class (snapshot pricing); demoted pages, which are worth nothing, do not count; a
// snapshot pool group's wait counts 1/kSnapshotWeight. When the
// youngest victim's wait is below 1/kHysteresis of the oldest's and the young pool group has
// evicted at least kMinVictims pages since the last step, about 1/kStepDivisor of the tier moves
// from the old pool group to the young one. A step that cannot be taken (LOCKED pages, GPU
// floors, reserved slots) is skipped: it changes nothing. On the GPU no pool group goes below
// its floor: what the declared constraints need (the hybrid manager declares one request of
// ServingConfig::max_seq_len).
#include <algorithm>

#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

namespace {

constexpr double kHysteresis = 1.5;
constexpr uint64_t kMinVictims = 16;
constexpr uint64_t kStepDivisor = 128;
// A snapshot's bytes count this many times a KV page's: dropping it loses the whole KV run under
// it, dropping a KV page one block. Measured on the conversation trace (bench/RESULTS.md): 2 took
// Nemotron-H at one 80 GiB GPU tier from 20.58 M to 22.05 M reused tokens and moved the other
// runs by under 1 %; 4 measured the same as 2. With snapshot pricing (each snapshot's wait also
// weighted by its age class) 1 measured 0.3-4 % more reuse in 6 of 8 whole-trace runs but 11 %
// less on the demo's slice (bench/RESULTS.md, 2026-12-01): 2 stays.
constexpr uint64_t kSnapshotWeight = 2;

}  // namespace

std::vector<uint64_t> rebalance_weights(const StoragePlan& plan) {
  std::vector<uint64_t> weights(plan.pool_groups().size(), 0);
  for (const CacheGroup& g : plan.cache_groups()) {
    const PoolGroup& pg = plan.pool_group(g.pool_group);
    if (g.policy != ReusePolicy::kPrivate && !pg.fixed_private && !pg.live_floor)
      weights[pg.id.value] = 1;
    if (g.snapshot_pool_group) weights[g.snapshot_pool_group->value] = 1;
  }
  for (const CacheGroup& g : plan.cache_groups()) {
    uint64_t& w = weights[g.page_pool_group(true).value];
    if (g.kind == GroupKind::kSsm && w != 0) w = kSnapshotWeight;
  }
  return weights;
}

std::optional<std::vector<uint64_t>> ManagerCore::rebalance_target(storage::TierIndex t) const {
  const TierPlan& tp = plan_.tiers()[t.value];
  std::optional<PoolGroupId> young, old;
  uint64_t young_age = UINT64_MAX, old_age = 0, used = 0;
  std::vector<uint64_t> want;
  for (const PoolGroup& pg : plan_.pool_groups()) {
    want.push_back(storage_.counts(t, pg.id).total);
    used += want.back() * pg.slot_bytes;
    const uint64_t weight = rebalance_weights_[pg.id.value];
    if (weight == 0) continue;
    uint64_t age = storage_.pressure_age(t, pg.id);
    if (age != UINT64_MAX) age /= weight;
    if (!young || age < young_age) young = pg.id, young_age = age;
    if (!old || age >= old_age) old = pg.id, old_age = age;
  }
  if (!young || !old || *young == *old) return std::nullopt;
  if (storage_.victims(t, *young) < kMinVictims) return std::nullopt;
  if (old_age != UINT64_MAX && static_cast<double>(old_age) < kHysteresis * young_age)
    return std::nullopt;
  const PoolGroup& to = plan_.pool_group(*young);
  const PoolGroup& from = plan_.pool_group(*old);
  const uint64_t quota = quotas_[t.value];
  const uint64_t gain = std::max<uint64_t>(1, quota / kStepDivisor / to.slot_bytes);
  const uint64_t spare = quota > used ? quota - used : 0;
  const uint64_t need = gain * to.slot_bytes > spare ? gain * to.slot_bytes - spare : 0;
  const uint64_t loss = (need + from.slot_bytes - 1) / from.slot_bytes;
  const uint64_t floor = tp.kind == TierKind::kGpu ? from.floor_slots : 0;
  if (want[from.id.value] < floor + loss) return std::nullopt;
  want[from.id.value] -= loss;
  want[to.id.value] += gain;
  return want;
}

bool ManagerCore::need_adjustment() const {
  std::shared_lock lock(mu_);
  if (!plan_.config().pool_rebalance) return false;
  for (uint32_t t = 0; t < plan_.tiers().size(); ++t) {
    if (rebalance_target(storage::TierIndex(t))) return true;
  }
  return false;
}

Result<bool> ManagerCore::adjust() {
  std::unique_lock lock(mu_);
  if (!plan_.config().pool_rebalance) {
    return Status(StatusCode::kFailedPrecondition,
                  "adjust: pool rebalancing is off (ManagerConfig::pool_rebalance)");
  }
  bool changed = false;
  for (uint32_t i = 0; i < plan_.tiers().size(); ++i) {
    const storage::TierIndex t(i);
    const std::optional<std::vector<uint64_t>> want = rebalance_target(t);
    if (!want) continue;
    storage_.reset_victims(t);
    if (!check_slots(t, *want, "adjust").is_ok()) continue;
    if (!apply_slots(t, *want).is_ok()) continue;  // the backend could not back the growth
    changed = true;
  }
  after_mutation();
  return changed;
}

}  // namespace hybridkv::cache_detail
