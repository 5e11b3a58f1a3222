// Pages: one page of one cache group on one (tier, slot), in a dense table addressed by PageId.
//
// A page's state is derived from its counts; Storage is the only writer of the counts, the owner
// tag and the queue links (everyone else reads a const Page):
//   active_refs > 0              -> LOCKED    (on GPU, used by ACTIVE caches; never moves)
//   else suspended_refs > 0      -> HELD      (may be demoted to a colder tier, never dropped)
//   else owner != kNoOwner       -> DROPPABLE (kept for its owner, the prefix index; evictable)
//   else                         -> the page is released and its id recycled.
// HELD and DROPPABLE pages sit in exactly one eviction queue (unless pinned by an operation in
// progress); LOCKED pages sit in none.
#pragma once

#include <cstddef>

#include <cstdint>

#include "hybridkv/ids.h"
#include "hybridkv/memory.h"
#include "hybridkv/plan.h"
#include "util/chunked_rows.h"

namespace hybridkv::storage {

struct PageTag {};
struct SlotTag {};
struct TierTag {};
using PageId = StrongId<PageTag>;     // a page of the page table
using SlotId = StrongId<SlotTag>;     // a slot of one (tier, pool group)
using TierIndex = StrongId<TierTag>;  // a tier by position in the plan (GPU first)
inline constexpr PageId kNoPage{};
inline constexpr TierIndex kGpuTier{0};  // the plan always lists the GPU tier first

// What the owner of a DROPPABLE page (the prefix index) knows it by; opaque to storage.
using OwnerTag = uint32_t;
inline constexpr OwnerTag kNoOwner = UINT32_MAX;
inline constexpr int32_t kDefaultPriority = 35;

// Age classes: class c ages 2^((c - kNeutralAgeClass) / 4) times as fast as a neutral page
// (class 0: 1/2; the last: about 9.5), so a page worth half as much per byte waits half as long.
inline constexpr uint8_t kNeutralAgeClass = 4;
inline constexpr uint8_t kAgeClasses = 18;
uint64_t age_factor_256(uint8_t age_class);
// The class whose factor is nearest `factor` (clamped to the range).
uint8_t age_class_for(double factor);

enum class PageState : uint8_t { kReleased, kLocked, kHeld, kDroppable };
enum class QueueKind : uint8_t { kNone, kHeld, kDroppable };
// The two kinds of reference a cache takes on a page.
enum class Ref : uint8_t { kActive, kSuspended };

// The fields every walk over a cache's pages reads (state, tier, queue, eviction order) come
// first and fit one cache line; the record is aligned to it, so such a walk misses once per page
// (the record used to span two or three lines: 112 bytes at any offset).
struct alignas(64) Page {
  uint64_t lru_tick = 0;  // when the page became evictable (queue order within a priority)
  CacheGroupId group;
  PoolGroupId pool_group;
  TierIndex tier_index = kGpuTier;
  SlotId slot;
  uint32_t active_refs = 0;
  uint32_t suspended_refs = 0;
  OwnerTag owner = kNoOwner;  // set while the prefix index keeps the page
  int32_t priority = kDefaultPriority;
  // Intrusive links of the queue bucket the page is in (QueueKind::kNone: none).
  PageId prev;
  PageId next;
  // Kept copies (ManagerConfig::keep_colder_copies): a tree page onboarded from a colder tier
  // leaves its bytes there as a copy page (copy_below); evicting the page returns it to that
  // copy without a transfer. A copy page (copy_of: the page it backs) has no holder: DROPPABLE,
  // demoted (it goes before every page whose bytes exist nowhere else), never moved, dropped
  // without telling the owner.
  PageId copy_of;
  TierKind tier = TierKind::kGpu;
  QueueKind queue = QueueKind::kNone;
  bool pinned = false;  // out of the queues while an operation works on it
  bool live = false;    // false: the id is on the free list
  // Set by the owner for a page that cannot serve a request now (KV no snapshot can resume
  // into, a snapshot a deeper one supersedes): while DROPPABLE it goes before every page that
  // is not, and is dropped rather than copied down a tier (HELD, its holder still needs it).
  bool demoted = false;
  // How fast the page ages in its queue (value-aware eviction): its wait counts
  // age_factor_256(age_class) / 256 times; set by the owner from what the page is worth per byte.
  uint8_t age_class = kNeutralAgeClass;
  // --- the colder fields: copies and counters ---
  PageId copy_below;
  uint32_t hits = 0;  // times a match served the page since it was allocated
  CopyEvent ready;    // last copy that wrote the page's slot
  // The copy of the page's last move to a colder tier, while it may not have run yet: in the
  // batch being collected (offload_pending) or submitted (offload_event, offload_index). A page
  // released before the copy ran has it cancelled.
  uint32_t offload_pending = UINT32_MAX;
  uint32_t offload_index = 0;
  CopyEvent offload_event;

  bool owned() const { return owner != kNoOwner; }
  bool is_copy() const { return copy_of != kNoPage; }
  // Eviction order: rank ascending (demoted pages first, then by priority), then LRU. The
  // shipped policies rank a HELD page by its priority alone (ranked_lru_policy.cc).
  int64_t rank() const { return demoted ? int64_t{priority} - (int64_t{1} << 32) : priority; }
  // Its wait at `now`, in neutral ticks: the queues evict the longest wait of the lowest rank.
  uint64_t weighted_age(uint64_t now) const {
    return (now - lru_tick) * age_factor_256(age_class) / 256;
  }
  PageState state() const {
    if (!live) return PageState::kReleased;
    if (is_copy()) return PageState::kDroppable;
    if (active_refs > 0) return PageState::kLocked;
    if (suspended_refs > 0) return PageState::kHeld;
    if (owned()) return PageState::kDroppable;
    return PageState::kReleased;
  }
};
// The hot fields stay in the first line (a reordering that breaks this fails to build).
static_assert(offsetof(Page, age_class) < 64 && sizeof(Page) == 128);

// Every page record by id, in chunks that never move (a new page copies no other).
using PageTable = ChunkedRows<Page>;

}  // namespace hybridkv::storage
