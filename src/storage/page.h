// Pages: one page of one cache group on one (tier, slot), in a dense table addressed by PageId.
//
// A page's state is derived from its counts, kept here and nowhere else:
//   active_refs > 0            -> LOCKED    (on GPU, used by ACTIVE caches; never moves)
//   else suspended_refs > 0    -> HELD      (may be demoted to a colder tier, never dropped)
//   else in_tree               -> DROPPABLE (owned only by its eviction queue)
//   else                       -> the page is released and its id recycled.
// HELD and DROPPABLE pages sit in exactly one eviction queue (unless pinned by an operation in
// progress); LOCKED pages sit in none.
#pragma once

#include <cstdint>

#include "hybridkv/memory.h"
#include "hybridkv/plan.h"

namespace hybridkv::storage {

using PageId = uint32_t;
inline constexpr PageId kNoPage = UINT32_MAX;
inline constexpr int32_t kDefaultPriority = 35;

enum class PageState : uint8_t { kReleased, kLocked, kHeld, kDroppable };
enum class QueueKind : uint8_t { kNone, kHeld, kDroppable };

struct Page {
  CacheGroupId group;
  PoolGroupId pool_group;
  TierKind tier = TierKind::kGpu;
  uint32_t slot = 0;
  uint32_t active_refs = 0;
  uint32_t suspended_refs = 0;
  bool in_tree = false;
  uint32_t tree_node = UINT32_MAX;  // the prefix-tree node holding the page (in_tree only)
  bool pinned = false;              // out of the queues while an operation works on it
  bool live = false;                // false: the id is on the free list
  int32_t priority = kDefaultPriority;
  uint64_t lru_tick = 0;  // when the page became evictable
  CopyEvent ready;        // last copy that wrote the page's slot
  // Intrusive links of the queue bucket the page is in (QueueKind::kNone: none).
  QueueKind queue = QueueKind::kNone;
  PageId prev = kNoPage;
  PageId next = kNoPage;

  PageState state() const {
    if (!live) return PageState::kReleased;
    if (active_refs > 0) return PageState::kLocked;
    if (suspended_refs > 0) return PageState::kHeld;
    if (in_tree) return PageState::kDroppable;
    return PageState::kReleased;
  }
};

}  // namespace hybridkv::storage
