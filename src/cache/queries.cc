// Reads of one cache: its scalar fields, its reuse match, its block tables and state indices.
#include <type_traits>
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

// caches_ may grow while a span from tokens() is held (another thread creating a cache): its
// records must move, never copy, so that their token buffers stay where they are.
static_assert(std::is_nothrow_move_constructible_v<CacheRecord>);

std::span<const int32_t> ManagerCore::tokens(uint32_t id) const {
  std::shared_lock lock(mu_);
  return caches_[id].tokens;
}

std::span<const int32_t> CoreAccess::tokens(const KvCache& cache) {
  return cache.core_->tokens(cache.id_);
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

}  // namespace hybridkv::cache_detail
