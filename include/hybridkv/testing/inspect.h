// hybridkv_testing: checks and hooks for tests, benchmarks and `hybridkv sim --verify`; not part
// of the shipped library (link hybridkv::testing).
//
// check_invariants() runs every invariant of DESIGN §9 (slot ownership, page states against
// their holders, queue contents and order, tree consistency, counters); InvariantChecker adds
// what needs memory across calls (a tree block's coverage only grows). debug_snapshot() dumps the
// whole metadata state for before/after equality around refused operations. The library reaches
// the manager's state through the implementation's own access point (cache_detail::CoreAccess);
// the product's interfaces carry no hook for it.
//
// Thread-safety: each call takes the manager's lock (shared).
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridkv/manager.h"

namespace hybridkv::testing {

// Every invariant; empty when all hold, else the first broken one.
std::string check_invariants(const KvCacheManager& manager);
// The whole metadata state (pages, slots, queues, caches, tree), for before/after equality.
std::string debug_snapshot(const KvCacheManager& manager);

// One page kept by the prefix tree, and where it is.
struct TreePage {
  BlockKey key{};
  CacheGroupId group;
  TierKind tier = TierKind::kGpu;
  PoolGroupId pool_group;
  uint32_t slot = 0;
  uint32_t coverage = 0;
  uint64_t start = 0;     // token position of the block's first token
  bool demoted = false;   // evicted before every page that is not (snapshot-aware eviction)
  uint8_t age_class = 0;  // how fast it ages in its queue (snapshot pricing; 4 = like KV)
};
std::vector<TreePage> tree_pages(const KvCacheManager& manager);

// CPU access to pool bytes at slot addresses (KvCacheManager::slot_address plus an offset): a
// plain copy where pools are host memory, a device copy on CUDA's GPU tier.
void read_pool_bytes(const KvCacheManager& manager, void* dst, const std::byte* src, size_t n);
void write_pool_bytes(const KvCacheManager& manager, std::byte* dst, const void* src, size_t n);
// Many transfers in one go (CUDA: one kernel and one synchronization for all of them).
void read_pool_bytes(const KvCacheManager& manager, std::span<const PoolTransfer> transfers);
void write_pool_bytes(const KvCacheManager& manager, std::span<const PoolTransfer> transfers);

// check_invariants() plus the invariants across calls: a tree block's coverage never shrinks
// while the block lives.
class InvariantChecker {
 public:
  std::string check(const KvCacheManager& manager);

 private:
  std::map<std::pair<BlockKey, uint32_t>, uint32_t> coverage_;
};

}  // namespace hybridkv::testing
