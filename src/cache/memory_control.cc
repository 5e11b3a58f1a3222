// Runtime quotas (issue 11 item 13): a tier's quota is read and changed while caches live.
// Shrinking makes room as any allocation would (DROPPABLE pages dropped or demoted first, then
// HELD pages demoted), moves what is left above the new end into the slots below it, and is
// refused, changing nothing, when LOCKED pages alone (or pages that cannot leave the tier)
// exceed the new slot count. Growing stops at the slots the backend reserved.
#include "cache/manager_core.h"
#include "hybridkv/units.h"
#include "storage/room.h"

namespace hybridkv::cache_detail {

MemoryControl::MemoryControl(ManagerCore& core)
    : core_(core),
      rebalanced_(rebalanced_pool_groups(core.plan_)),
      rebalancer_(find_rebalance_policy(core.plan_.config().policies.rebalance).value()) {
  for (const TierPlan& t : core.plan_.tiers()) quotas_.push_back(t.quota);
}

namespace {

Result<storage::TierIndex> tier_index(const StoragePlan& plan, TierKind kind) {
  for (uint32_t t = 0; t < plan.tiers().size(); ++t) {
    if (plan.tiers()[t].kind == kind) return storage::TierIndex(t);
  }
  return Status::not_found(std::string("no ") + tier_kind_name(kind) + " tier is configured");
}

}  // namespace

Result<uint64_t> MemoryControl::quota(TierKind kind) const {
  std::shared_lock lock(core_.mu_);
  const Result<storage::TierIndex> t = tier_index(core_.plan_, kind);
  if (!t) return t.status();
  return quotas_[t->value];
}

// The new slot counts of every pool group, or why the quota cannot be taken (nothing changed).
Result<std::vector<uint64_t>> MemoryControl::quota_slots(storage::TierIndex t,
                                                         uint64_t bytes) const {
  const TierPlan& tp = core_.plan_.tiers()[t.value];
  const std::string what =
      std::string("set_quota(") + tier_kind_name(tp.kind) + ", " + format_bytes(bytes) + ")";
  if (tp.kind == TierKind::kGpu) {
    const uint64_t minimum = *minimum_gpu_quota(core_.plan_.config());
    if (bytes < minimum) {
      return Status::invalid(what + ": below the GPU floors of this plan (" +
                             format_bytes(minimum) + ")");
    }
  }
  Result<std::vector<uint64_t>> want = estimate_slots(core_.plan_.config(), tp.kind, bytes);
  if (!want) return Status::invalid(what + ": " + want.status().message());
  if (Status s = check_slots(t, *want, what); !s) return s;
  return want;
}

Status MemoryControl::check_slots(storage::TierIndex t, const std::vector<uint64_t>& want,
                                  const std::string& what) const {
  const TierPlan& tp = core_.plan_.tiers()[t.value];
  for (const PoolGroup& pg : core_.plan_.pool_groups()) {
    const uint64_t n = want[pg.id.value], reserved = tp.reserved_slots[pg.id.value];
    const std::string where = what + ": pool group " + std::to_string(pg.id.value) + " needs " +
                              std::to_string(n) + " slots";
    if (n > reserved) {
      return Status(StatusCode::kRefused, where + "; the backend reserved " +
                                              std::to_string(reserved) +
                                              " (raise the tier's max_quota_bytes)");
    }
    const storage::Storage::SlotCounts c = core_.storage_.counts(t, pg.id);
    if (n >= c.total) continue;
    const uint64_t locked = c.total - c.free - c.evictable;
    if (locked > n) {
      return Status(StatusCode::kOutOfPages,
                    where + ", but " + std::to_string(locked) + " of its pages are LOCKED");
    }
    const uint64_t room = core_.storage_.max_room(t, pg.id);
    if (room < c.total - n) {
      return Status(StatusCode::kOutOfPages, where + ", but only " + std::to_string(room) +
                                                 " of its " + std::to_string(c.total) +
                                                 " slots can be freed (HELD pages have no " +
                                                 "colder tier with room)");
    }
  }
  return Status::ok();
}

Status MemoryControl::apply_slots(storage::TierIndex t, const std::vector<uint64_t>& want) {
  const TierKind kind = core_.plan_.tiers()[t.value].kind;
  // The memory of the pools that grow is backed first: a failure there changes nothing.
  std::vector<std::pair<PoolGroupId, uint64_t>> grown;
  for (const PoolGroup& pg : core_.plan_.pool_groups()) {
    const uint64_t total = core_.storage_.counts(t, pg.id).total;
    if (want[pg.id.value] <= total) continue;
    if (Status s = core_.backend_->grow(kind, pg.id, want[pg.id.value]); !s) {
      for (const auto& [g, before] : grown) core_.backend_->shrink(kind, g, before, {});
      return s;
    }
    grown.emplace_back(pg.id, total);
  }
  CopyEvent moved;
  std::vector<ManagerCore::PoolMoves> moves(core_.plan_.pool_groups().size());
  for (const PoolGroup& pg : core_.plan_.pool_groups()) {
    const uint64_t n = want[pg.id.value];
    const storage::Storage::SlotCounts c = core_.storage_.counts(t, pg.id);
    if (n < c.total && c.free < c.total - n)
      storage::make_room(core_.storage_, t, pg.id, c.total - n, core_.index_);
    const CopyEvent e = core_.storage_.resize_pool(t, pg.id, n);
    core_.deliver_notices();
    if (n < c.total) core_.backend_->shrink(kind, pg.id, n, e);
    if (e.ticket > moved.ticket) moved = e;
    if (e.ticket != 0) moves[pg.id.value] = {n, e.ticket};
  }
  // Every page of an ACTIVE cache is on the GPU: only a GPU tier's moves reach them. Those
  // that moved sat at or above their pool group's new end; the tables that name them follow,
  // and their caches' kernels wait for the copies.
  if (moved.ticket == 0 || t != storage::kGpuTier) return Status::ok();
  for (CacheRecord& rec : core_.caches_) {
    if (!rec.in_use || !rec.active()) continue;
    if (core_.follow_moved_pages(rec, moves)) rec.note_ready(moved);
  }
  return Status::ok();
}

// One eviction at a time (a move down makes its own room below), each toward one more free slot
// than the pool group has, so the victims are those the next allocations would have taken.
Result<uint64_t> MemoryControl::evict_ahead(std::span<const uint64_t> free_slots,
                                            uint64_t max_evictions) {
  std::unique_lock lock(core_.mu_);
  const size_t groups = core_.plan_.pool_groups().size();
  if (free_slots.size() != groups) {
    return Status::invalid("evict_ahead: free_slots has " + std::to_string(free_slots.size()) +
                           " entries; the plan has " + std::to_string(groups) + " pool groups");
  }
  core_.index_.tidy();  // first: its carries may demote pages this would evict
  uint64_t evicted = 0;
  for (const PoolGroup& pg : core_.plan_.pool_groups()) {
    for (; evicted < max_evictions; ++evicted) {
      const uint64_t free = core_.storage_.counts(storage::kGpuTier, pg.id).free;
      if (free >= free_slots[pg.id.value]) break;
      if (core_.storage_.max_room(storage::kGpuTier, pg.id) <= free)
        break;  // nothing left to evict
      storage::make_room(core_.storage_, storage::kGpuTier, pg.id, free + 1, core_.index_);
    }
  }
  if (evicted > 0) (void)core_.storage_.flush();  // the moves' copies start now
  core_.after_mutation();
  return evicted;
}

Result<ReuseMatch> MemoryControl::touch_reuse(const ReuseScope& scope,
                                              std::span<const int32_t> tokens,
                                              const PromptKeys* keys,
                                              std::span<const MultimodalItem> multimodal) {
  std::unique_lock lock(core_.mu_);
  std::span<const BlockKey> key_span;
  if (keys) {
    const Status s = CoreAccess::check_keys(*keys, core_.plan_.config(), scope, tokens, multimodal);
    if (!s) return s;
    key_span = CoreAccess::keys_of(*keys);
  }
  ReuseMatch match = core_.index_.touch_reuse(scope, tokens, multimodal, key_span);
  core_.after_mutation();
  return match;
}

Status MemoryControl::set_quota(TierKind kind, uint64_t bytes) {
  std::unique_lock lock(core_.mu_);
  const Result<storage::TierIndex> t = tier_index(core_.plan_, kind);
  if (!t) return t.status();
  Result<std::vector<uint64_t>> want = quota_slots(*t, bytes);
  if (!want) return want.status();
  if (Status s = apply_slots(*t, *want); !s) return s;
  quotas_[t->value] = bytes;
  core_.after_mutation();
  return Status::ok();
}

void MemoryControl::clear_reusable_blocks() {
  std::unique_lock lock(core_.mu_);
  core_.index_.clear();
  core_.after_mutation();
}

StorageStats MemoryControl::storage_stats() const {
  std::shared_lock lock(core_.mu_);
  StorageStats out;
  for (uint32_t t = 0; t < core_.storage_.num_tiers(); ++t) {
    const storage::TierIndex tier(t);
    TierStorage ts{core_.storage_.tier_kind(tier), {}};
    for (const PoolGroup& pg : core_.plan_.pool_groups()) {
      const storage::Storage::SlotCounts n = core_.storage_.counts(tier, pg.id);
      ts.pool_groups.push_back({pg.id, n.total, n.free, n.evictable});
    }
    out.tiers.push_back(std::move(ts));
  }
  out.live_caches = core_.live_caches_;
  out.active_caches = core_.active_caches_;
  return out;
}

Status MemoryControl::shutdown() {
  std::unique_lock lock(core_.mu_);
  if (core_.live_caches_ > 0) {
    return Status(StatusCode::kFailedPrecondition,
                  "shutdown refused: " + std::to_string(core_.live_caches_) +
                      " caches are still open (close them first)");
  }
  core_.shut_down_ = true;
  return Status::ok();
}

}  // namespace hybridkv::cache_detail
