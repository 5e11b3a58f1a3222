// MemoryControl: the manager-wide memory decisions, apart from any one request: the quota of
// each tier (read and changed while caches live), rebalancing slots between pool groups within
// a tier's budget (the policy named by ManagerConfig::policies.rebalance), clearing the
// reusable blocks, the eviction order ahead of queued requests (touch_reuse), the storage
// counts, and shutdown.
//
// It owns the quotas in force and the rebalancing policy; the pools, pages and caches it acts
// on belong to the ManagerCore it is part of, and every method takes the core's lock.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "cache/rebalance_policy.h"
#include "hybridkv/reuse.h"
#include "hybridkv/stats.h"
#include "hybridkv/status.h"
#include "storage/storage.h"

namespace hybridkv {
class PromptKeys;
}  // namespace hybridkv

namespace hybridkv::cache_detail {

class ManagerCore;

// Per pool group: whether rebalancing trades its slots (shared KV and snapshot pool groups).
std::vector<bool> rebalanced_pool_groups(const StoragePlan& plan);

class MemoryControl {
 public:
  explicit MemoryControl(ManagerCore& core);

  Result<uint64_t> quota(TierKind kind) const;
  Status set_quota(TierKind kind, uint64_t bytes);
  // Whether a rebalancing step would change a tier (shared lock), and the step (exclusive).
  bool need_adjustment() const;
  Result<bool> adjust();
  Result<uint64_t> evict_ahead(std::span<const uint64_t> free_slots, uint64_t max_evictions);
  Result<ReuseMatch> touch_reuse(const ReuseScope& scope, std::span<const int32_t> tokens,
                                 const PromptKeys* keys,
                                 std::span<const MultimodalItem> multimodal);
  void clear_reusable_blocks();
  StorageStats storage_stats() const;
  // Refused while caches are open; afterwards create() is refused.
  Status shutdown();

 private:
  // All private members: Requires the core's lock held (exclusively where they change anything).
  Result<std::vector<uint64_t>> quota_slots(storage::TierIndex tier, uint64_t bytes) const;
  // Whether the tier's pool groups can take these slot counts now (nothing changes).
  Status check_slots(storage::TierIndex tier, const std::vector<uint64_t>& want,
                     const std::string& what) const;
  // Requires: check_slots passed. Resizes the pools; ACTIVE caches' tables follow moved pages.
  // Backs growing pools first (a backend failure changes nothing and is returned), then resizes.
  Status apply_slots(storage::TierIndex tier, const std::vector<uint64_t>& want);
  // The slot counts one rebalancing step would give the tier (nullopt: leave it as it is).
  std::optional<std::vector<uint64_t>> rebalance_target(storage::TierIndex tier) const;

  ManagerCore& core_;
  std::vector<uint64_t> quotas_;             // per tier: the quota in force (set_quota changes it)
  const std::vector<bool> rebalanced_;       // per pool group
  const RebalancePolicy* const rebalancer_;  // nullptr: rebalancing off
};

}  // namespace hybridkv::cache_detail
