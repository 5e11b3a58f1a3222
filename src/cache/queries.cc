// Reads of one cache and of the whole manager, and the manager-wide operations.
#include <utility>

#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

using storage::kGpuTier;
using storage::TierIndex;

CacheInfo ManagerCore::info(uint32_t id) const {
  std::shared_lock lock(mu_);
  const CacheRecord& rec = caches_[id];
  return {rec.state, rec.capacity, rec.history, rec.beam_width, rec.committed, rec.ready};
}

ReuseMatch ManagerCore::reuse_match(uint32_t id) const {
  std::shared_lock lock(mu_);
  return caches_[id].match;
}

Result<std::span<const int32_t>> ManagerCore::block_table(uint32_t id, CacheGroupId group,
                                                          uint32_t beam) const {
  std::shared_lock lock(mu_);
  if (Status s = check_group(id, group, beam); !s) return s;
  if (plan_.cache_group(group).kind == GroupKind::kSsm) {
    return Status::invalid(label(id) + ": cache group " + std::to_string(group.value) +
                           " is an SSM group; use state_index");
  }
  const std::vector<int32_t>& table = caches_[id].groups[group.value].tables[beam];
  return std::span<const int32_t>(table.data(), table.size());
}

Result<int32_t> ManagerCore::state_index(uint32_t id, CacheGroupId group, uint32_t beam) const {
  std::shared_lock lock(mu_);
  if (Status s = check_group(id, group, beam); !s) return s;
  if (plan_.cache_group(group).kind != GroupKind::kSsm) {
    return Status::invalid(label(id) + ": cache group " + std::to_string(group.value) +
                           " is an attention group; use block_table");
  }
  const CacheRecord& rec = caches_[id];
  const PageId pid = rec.groups[group.value].pages[beam];
  if (!rec.active() || pid == kNoPage) return kBadPageIndex;
  return static_cast<int32_t>(storage_.page(pid).slot.value);
}

ReuseMatch ManagerCore::probe(prefix::BlockHasher& hasher, const ReuseScope& scope,
                              std::span<const int32_t> tokens,
                              std::span<const MultimodalItem> multimodal) const {
  std::shared_lock lock(mu_);
  return index_.match(hasher, scope, tokens, multimodal).match;
}

void ManagerCore::clear_reusable_blocks() {
  std::unique_lock lock(mu_);
  index_.clear();
  after_mutation();
}

std::vector<CacheEvent> ManagerCore::take_events() {
  std::unique_lock lock(mu_);
  return index_.take_events();
}

ReuseStats ManagerCore::reuse_stats() const {
  std::shared_lock lock(mu_);
  return index_.stats();
}

ReuseStats ManagerCore::take_reuse_stats() {
  std::unique_lock lock(mu_);
  return index_.take_stats();
}

IterationStats ManagerCore::take_iteration_stats() {
  std::unique_lock lock(mu_);
  return storage_.take_stats();
}

StorageStats ManagerCore::storage_stats() const {
  std::shared_lock lock(mu_);
  StorageStats out;
  for (uint32_t t = 0; t < storage_.num_tiers(); ++t) {
    const TierIndex tier(t);
    TierStorage ts{storage_.tier_kind(tier), {}};
    for (const PoolGroup& pg : plan_.pool_groups()) {
      const storage::Storage::SlotCounts n = storage_.counts(tier, pg.id);
      ts.pool_groups.push_back({pg.id, n.total, n.free, n.evictable});
    }
    out.tiers.push_back(std::move(ts));
  }
  out.live_caches = live_caches_;
  out.active_caches = active_caches_;
  return out;
}

Status ManagerCore::shutdown() {
  std::unique_lock lock(mu_);
  if (live_caches_ > 0) {
    return Status(StatusCode::kFailedPrecondition,
                  "shutdown refused: " + std::to_string(live_caches_) +
                      " caches are still open (close them first)");
  }
  shut_down_ = true;
  return Status::ok();
}

}  // namespace hybridkv::cache_detail
