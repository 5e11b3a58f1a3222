// One budget per tier (issue 12 item 3): with ManagerConfig::pool_rebalance the pool groups of
// a tier trade slots while serving, so that no fixed split (the typical step's) decides how many
// snapshots and how many KV pages are kept.
//
// The rule is one LRU over the tier's bytes: under it, the page every pool group would give up
// first would have waited equally long. Storage::pressure_age measures that wait, weighted by
// the page's age class (snapshot pricing prices a snapshot against KV there); demoted pages,
// which are worth nothing, do not count. The receiver is the youngest-victim pool group among
// those under pressure (at least kMinVictims evictions since the last step); the donor is
// the pool group, among those that can give the step's bytes, whose oldest page has waited
// longest, where one that never evicted a page of value and can give the step from its free
// slots counts as infinitely old (slots never needed are worth nothing, however young its
// pages). When the donor's wait is at least kHysteresis times the receiver's, about
// 1/kStepDivisor of the tier moves from the one to the other. A step that cannot be taken
// (LOCKED pages, GPU floors, reserved slots) is skipped: it changes nothing. On the GPU no pool
// group goes below its floor: what the declared constraints need (the hybrid manager declares
// one request of ServingConfig::max_seq_len).
//
// Measured on the conversation trace (bench/RESULTS.md, 2026-12-01, later): choosing the donor
// among the pool groups that can give and the receiver among those under pressure (before, an
// idle pool group too small to give, or one with no slot, stopped every step on its tier), and
// judging idle pool groups by their oldest page, took Nemotron-H at GPU 40 + host 200 GiB with
// fp8 snapshots from 0.897 to 0.913 of attention-only reuse and Qwen3-Next at 16 + 64 GiB from
// 0.817 to 0.858, and made the starting split (--typical-len) matter little. Counting the free
// slots of a pool group that never evicted a page of value as worth nothing (2026-12-01, sixth
// session) made it matter less where the split starts far off: fp8, 16 + 64 GiB, --typical-len
// 65536, Nemotron-H 0.748 -> 0.836 and Qwen3-Next 0.859 -> 0.899 (at the default 8192
// Nemotron-H 0.855 -> 0.852). Counting every free slot so (tried) shrank the GPU's state pool
// group to its floor on the demo's slice (live states free theirs all the time) and cost it
// 14 %. Snapshots' waits are no longer divided by 2: snapshot pricing weighs them, and the
// extra weight now cost the demo's slice 8 %.
#include <algorithm>

#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

namespace {

constexpr double kHysteresis = 1.5;
constexpr uint64_t kMinVictims = 16;
constexpr uint64_t kStepDivisor = 128;

}  // namespace

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

std::optional<std::vector<uint64_t>> ManagerCore::rebalance_target(storage::TierIndex t) const {
  const TierPlan& tp = plan_.tiers()[t.value];
  const uint64_t quota = quotas_[t.value];
  std::vector<uint64_t> want, age;
  uint64_t used = 0;
  std::optional<PoolGroupId> to;
  for (const PoolGroup& pg : plan_.pool_groups()) {
    want.push_back(storage_.counts(t, pg.id).total);
    used += want.back() * pg.slot_bytes;
    age.push_back(storage_.pressure_age(t, pg.id));
    if (!rebalanced_[pg.id.value] || storage_.victims(t, pg.id) < kMinVictims) continue;
    if (!to || age.back() < age[to->value]) to = pg.id;
  }
  if (!to) return std::nullopt;
  const uint64_t gain =
      std::max<uint64_t>(1, quota / kStepDivisor / plan_.pool_group(*to).slot_bytes);
  const uint64_t spare = quota > used ? quota - used : 0;
  const uint64_t gain_bytes = gain * plan_.pool_group(*to).slot_bytes;
  const uint64_t need = gain_bytes > spare ? gain_bytes - spare : 0;
  std::optional<PoolGroupId> from;
  uint64_t loss = 0;
  for (const PoolGroup& pg : plan_.pool_groups()) {
    if (pg.id == *to || !rebalanced_[pg.id.value]) continue;
    const uint64_t slots = (need + pg.slot_bytes - 1) / pg.slot_bytes;
    const uint64_t floor = tp.kind == TierKind::kGpu ? pg.floor_slots : 0;
    if (want[pg.id.value] < floor + slots) continue;
    // Slots never needed are worth nothing (Storage::ever_full).
    if (!storage_.ever_full(t, pg.id) && storage_.counts(t, pg.id).free >= slots)
      age[pg.id.value] = UINT64_MAX;
    if (!from || age[pg.id.value] >= age[from->value]) from = pg.id, loss = slots;
  }
  if (!from) return std::nullopt;
  if (age[from->value] != UINT64_MAX &&
      static_cast<double>(age[from->value]) < kHysteresis * static_cast<double>(age[to->value]))
    return std::nullopt;
  want[from->value] -= loss;
  want[to->value] += gain;
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
