// hybridkv_testing: checks and hooks for tests, benchmarks and `hybridkv sim --verify`; not part
// of the shipped library (link hybridkv::testing).
//
// check_invariants() runs every invariant of DESIGN §9 (slot ownership, page states against
// their holders, queue contents and order, tree consistency, counters); InvariantChecker adds
// what needs memory across calls (a tree block's coverage only grows). debug_snapshot() dumps the
// whole metadata state for before/after equality around refused operations.
//
// Thread-safety: each call takes the manager's lock (shared).
#pragma once

#include <map>
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

// Host backend: a closed gate holds every copy until opened (a test proves nothing reads a page
// before its copy completed). No effect on other backends.
void set_copy_gate(KvCacheManager& manager, bool open);
// DISK tier: every later write fails as if the device returned EIO (the slot is marked bad).
void set_disk_fault(KvCacheManager& manager, bool on);

// check_invariants() plus the invariants across calls: a tree block's coverage never shrinks
// while the block lives.
class InvariantChecker {
 public:
  std::string check(const KvCacheManager& manager);

 private:
  std::map<std::pair<BlockKey, uint32_t>, uint32_t> coverage_;
};

// The friend of KvCacheManager (and of its core) through which this library reaches the
// manager's state.
class ManagerInspector {
 public:
  static const cache_detail::ManagerCore& core(const KvCacheManager& manager);
  static std::vector<TreePage> tree_pages(const cache_detail::ManagerCore& core);
};

}  // namespace hybridkv::testing
