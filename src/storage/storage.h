// Storage: the slots of every (tier, pool group), the page table, the eviction queues, and the
// moves between tiers.
//
// Making room on tier t evicts from t's queues: a HELD page moves to tier t+1 (making room there
// first); a DROPPABLE page moves down when t+1 can make room, else (and always on the last tier)
// it is dropped. Callers first ask max_room() whether an operation can succeed and only then
// act, so a failed operation changes nothing. Copies are collected and submitted as one batch by
// flush(); the batch's event becomes the ready event of every page it wrote and the last-use
// event of every slot it read.
//
// Thread-safety: none; the manager's mutex serializes every call.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "hybridkv/stats.h"
#include "memory/backend.h"
#include "storage/eviction_queue.h"
#include "storage/page.h"

namespace hybridkv::storage {

// Pages of one operation's own caches that sit in queues, per [tier][pool group]: they will be
// pinned, so they are no room for it.
using Exclusions = std::vector<std::vector<uint64_t>>;

class Storage {
 public:
  Storage(const StoragePlan& plan, memory::MemoryBackend* backend);

  const StoragePlan& plan() const { return plan_; }
  size_t num_tiers() const { return tiers_.size(); }
  TierKind tier_kind(size_t tier) const { return tiers_[tier].kind; }
  Exclusions empty_exclusions() const;

  uint64_t total_slots(size_t tier, PoolGroupId pg) const;
  uint64_t free_slots(size_t tier, PoolGroupId pg) const;
  uint64_t evictable_slots(size_t tier, PoolGroupId pg) const;
  // The most free slots that evictions could make on (tier, pg), own pages excluded.
  uint64_t max_room(size_t tier, PoolGroupId pg, const Exclusions& excluded) const;
  // Requires: max_room(tier, pg, none) >= n. Evicts until n slots are free.
  void make_room(size_t tier, PoolGroupId pg, uint64_t n);

  // A fresh page of `group` on `tier`. Requires: a free slot. Refs start at zero; the caller
  // adds its ref before anything else runs.
  PageId allocate(CacheGroupId group, size_t tier);
  // Moves a page to another tier. Requires: a free slot there; the page is not LOCKED.
  void move(PageId id, size_t dst_tier);
  // Queues a GPU-to-GPU copy of src's slot into dst's slot (snapshots, partial tails). dst
  // becomes ready when the copy completes; src may not be overwritten before then.
  void copy_page(PageId src, PageId dst);
  // Takes a page out of its queue while an operation works on it / puts it back.
  void pin(PageId id);
  void unpin(PageId id);
  // Re-derives queue membership after a ref change; releases a page nobody refers to.
  void refresh(PageId id);
  void set_priority(PageId id, int32_t priority);
  // Submits the copies collected since the last flush; returns their event.
  CopyEvent flush();
  void wait(CopyEvent event) { backend_->wait(event); }

  Page& page(PageId id) { return pages_[id]; }
  const Page& page(PageId id) const { return pages_[id]; }
  size_t page_capacity() const { return pages_.size(); }
  std::byte* slot_address(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t slot) const;
  memory::MemoryBackend& backend() { return *backend_; }

  // Called before a DROPPABLE page is dropped (the prefix tree unlinks its block).
  std::function<void(PageId)> on_drop;
  // Called after a page moved to another tier (the prefix tree reports it).
  std::function<void(PageId)> on_move;
  IterationStats stats;

  // Slot ownership is exclusive, free lists and pages agree, queues hold exactly the evictable
  // unpinned pages. Empty string = fine; otherwise the first broken invariant.
  std::string check() const;
  // Every page and slot, for before/after comparisons in tests.
  std::string snapshot() const;

 private:
  struct PoolSlots {
    uint64_t total = 0;
    std::vector<uint32_t> free;       // stack; lowest slot on top at start
    std::vector<CopyEvent> last_use;  // per slot: the last copy that touched it
    EvictionQueue held;
    EvictionQueue droppable;
    PoolSlots(std::vector<Page>* pages)
        : held(pages, QueueKind::kHeld), droppable(pages, QueueKind::kDroppable) {}
  };
  struct Tier {
    TierKind kind;
    std::vector<PoolSlots> pools;  // by pool group id
  };

  PoolSlots& slots(size_t tier, PoolGroupId pg) { return tiers_[tier].pools[pg.value]; }
  const PoolSlots& slots(size_t tier, PoolGroupId pg) const { return tiers_[tier].pools[pg.value]; }
  size_t tier_index(TierKind kind) const;
  uint32_t take_slot(size_t tier, PoolGroupId pg);
  void give_slot(size_t tier, PoolGroupId pg, uint32_t slot, CopyEvent last_use);
  void drop(PageId id);
  void release(PageId id);

  StoragePlan plan_;
  memory::MemoryBackend* backend_;
  std::vector<Tier> tiers_;
  std::vector<Page> pages_;
  std::vector<PageId> free_pages_;
  uint64_t tick_ = 0;
  // Copies since the last flush, with what their event must be recorded on.
  std::vector<memory::SlotCopy> pending_;
  std::vector<PageId> pending_pages_;
  struct SlotRef {
    size_t tier;
    PoolGroupId pg;
    uint32_t slot;
  };
  std::vector<SlotRef> pending_slots_;
};

}  // namespace hybridkv::storage
