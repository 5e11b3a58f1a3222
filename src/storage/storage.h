// Storage: the slots of every (tier, pool group), the page table, the eviction queues, and the
// moves between tiers. It is the only writer of a page's counts, owner, state and queue position.
//
// Page lifetimes: allocate() gives a page no holder; the caller gives it one at once, either a
// reference of a cache (add_ref: Ref::kActive = LOCKED, Ref::kSuspended = HELD) or an owner
// (set_owner: the prefix index keeps it, DROPPABLE once no cache refers to it). A page nobody
// refers to and nobody owns is released on the spot. Storage knows nothing of what owns a page:
// it never calls the owner; tier and priority changes of owned pages are kept as notices the
// caller hands on (deliver_notices, room.h).
//
// Making room on tier t evicts from t's queues in value order (priority, then LRU): a HELD page
// moves to the first tier below where room can be made (t+1, or a deeper one when t+1 holds
// only pages that cannot move), making room there first; a DROPPABLE page moves down likewise
// when it is worth it, else (and always on the last tier) it is dropped; a page that kept a
// copy below when it came up (storage/copies.cc) goes back to it instead. Storage plans one
// eviction at a time (next_eviction, no side effect) and applies it (evict); the loop that makes
// room (storage/room.h) runs outside it, so the owner hears of a drop between two storage calls
// and never while one runs. Callers first ask max_room() whether an operation can succeed and
// only then act, so a failed operation changes nothing. Copies are collected and submitted as one
// batch by flush(); the batch's event becomes the ready event of every page it wrote and the
// last-use event of every slot it read.
//
// Thread-safety: none; the manager's mutex serializes every call.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridkv/stats.h"
#include "memory/backend.h"
#include "storage/eviction_policy.h"
#include "storage/offload_policy.h"
#include "storage/page.h"

namespace hybridkv::storage {

// An owned page moved to another tier or had its priority set: what it is now.
struct PageNotice {
  PageId page;
  OwnerTag owner = kNoOwner;
  CacheGroupId group;
  TierKind tier = TierKind::kGpu;
  int32_t priority = kDefaultPriority;
};

// One eviction toward free slots on a tier (Storage::next_eviction): what happens to `victim`.
struct Eviction {
  enum class Action : uint8_t {
    kReleaseCopy,   // the victim is a kept copy: its slot is freed
    kReturnToCopy,  // the victim goes back to its kept copy below (no transfer)
    kMoveDown,      // the victim moves to `below` (room there is made first)
    kDrop,          // the victim is dropped (its owner forgets it first)
  };
  PageId victim;
  Action action = Action::kDrop;
  TierIndex tier;
  TierIndex below;       // kMoveDown, and kDrop with short_below
  bool counted = false;  // the victim was not demoted: counts as pressure (Storage::victims)
  // Dropped only for want of a free slot below (the offload policy admits it where there is
  // one): counts as a want on that pool group below (Storage::wants).
  bool short_below = false;
};

// Pages of one operation's own caches that sit in queues, per [tier][pool group]: they will be
// pinned, so they are no room for it.
using Exclusions = std::vector<std::vector<uint64_t>>;

class Storage {
 public:
  Storage(const StoragePlan& plan, memory::MemoryBackend* backend);
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  size_t num_tiers() const { return tiers_.size(); }
  TierKind tier_kind(TierIndex tier) const { return tiers_[tier.value].kind; }
  Exclusions empty_exclusions() const;
  // Counts a queued page of an operation's own caches as no room for it.
  void exclude(Exclusions& excluded, PageId id) const { exclude(excluded, page(id)); }
  void exclude(Exclusions& excluded, const Page& p) const;

  struct SlotCounts {
    uint64_t total = 0;
    uint64_t free = 0;
    uint64_t evictable = 0;  // HELD and DROPPABLE pages in the queues
  };
  SlotCounts counts(TierIndex tier, PoolGroupId pg) const;
  // The most free slots that evictions could make on (tier, pg), not counting `own` queued
  // pages of the operation's own caches there (Exclusions).
  uint64_t max_room(TierIndex tier, PoolGroupId pg, uint64_t own = 0) const;
  // The next eviction toward n free slots on (tier, pg); nullopt once n are free. Changes
  // nothing. Requires: max_room(tier, pg) >= n. storage/room.h runs the loop.
  std::optional<Eviction> next_eviction(TierIndex tier, PoolGroupId pg, uint64_t n) const;
  // Applies it. Requires: it is the plan next_eviction just gave; for kMoveDown a free slot on
  // `below` (made with the victim pinned); for kDrop the owner has forgotten the victim.
  void evict(const Eviction& e);
  // The notices of owned pages that moved or changed priority since the last clear (the
  // vector keeps its capacity: an eviction loop allocates nothing for them).
  std::span<const PageNotice> notices() const { return notices_; }
  void clear_notices() { notices_.clear(); }
  bool has_notices() const { return !notices_.empty(); }

  // --- pressure (pool rebalancing) ---
  // How long (in weighted queue ticks) the page that (tier, pg) would give up first has waited:
  // the oldest DROPPABLE page that is not demoted (its next victim, or, with free slots, the
  // page it would evict once full). With no such page: UINT64_MAX when a free slot has waited
  // with no eviction since the last reset_victims (its bytes serve nothing), else 0 (only HELD
  // or demoted pages are left). Under one LRU over all bytes every pool group would show the
  // same age: the rebalancer moves bytes toward the youngest.
  uint64_t pressure_age(TierIndex tier, PoolGroupId pg) const;
  // Evictions of pages that were not demoted on (tier, pg) since the last reset_victims.
  uint64_t victims(TierIndex tier, PoolGroupId pg) const { return slots(tier, pg).victims; }
  // Pages dropped above since the last reset_victims that the offload policy would have copied
  // to (tier, pg) had it a free slot: room that slots no other pool group ever needed could buy.
  uint64_t wants(TierIndex tier, PoolGroupId pg) const { return slots(tier, pg).wants; }
  // Whether (tier, pg) ever evicted a page that was not demoted to make room: whether its slots
  // were ever all needed.
  bool ever_full(TierIndex tier, PoolGroupId pg) const { return slots(tier, pg).ever_full; }
  void reset_victims(TierIndex tier);

  // --- page lifetimes ---
  // A fresh page of `group` on `tier` (in the group's snapshot pool group with `snapshot`, when
  // it has one). Requires: a free slot; the caller calls add_ref or set_owner on it before any
  // other call.
  PageId allocate(CacheGroupId group, TierIndex tier, int32_t priority = kDefaultPriority,
                  bool snapshot = false);
  void add_ref(PageId id, Ref ref);
  // Releases the page when it was the last holder and nobody owns it.
  void drop_ref(PageId id, Ref ref);

  // A cache operation's page changes, planned by the caller and applied in one call each, in
  // the order given (the queue order is the one the single calls would give).
  struct PageRequest {
    CacheGroupId group;
    int32_t priority = kDefaultPriority;
  };
  // One reference of `ref` on each page, in order (a page listed twice gets two).
  void add_refs(std::span<const PageId> pages, Ref ref);
  // Fresh GPU pages, each LOCKED by one active reference. Requires: the room (max_room, then
  // make_room) for all of them.
  std::vector<PageId> allocate_active(std::span<const PageRequest> want);
  struct RefChange {
    PageId page;
    Ref from;               // the reference given up
    std::optional<Ref> to;  // the reference taken in its place (none: dropped)
  };
  void change_refs(std::span<const RefChange> changes);
  // One reference changes kind (resume: suspended -> active; suspend: the reverse).
  void convert_ref(PageId id, Ref from, Ref to);
  // The prefix index keeps the page / lets it go (released when no cache refers to it).
  void set_owner(PageId id, OwnerTag owner);
  void clear_owner(PageId id);
  // The owner evicts a DROPPABLE page itself (it has already forgotten it): counted as a
  // dropped page, then released.
  void drop_owned(PageId id);
  void set_priority(PageId id, int32_t priority);
  // The owner's verdict on the page's worth (Page::demoted); not an event.
  void set_demoted(PageId id, bool demoted);
  // How fast the page ages in its queue (Page::age_class); it rejoins as the most recent.
  void set_age_class(PageId id, uint8_t age_class);
  // A match served the page (Page::hits, read by the offload rule and snapshot pricing).
  void note_hit(PageId id);
  // A waiting request will reuse the page: a queued page rejoins its queue as the most recent
  // entry, as if a request had just used and released it. Nothing else changes.
  void touch(PageId id);
  // Takes a page out of its queue while an operation works on it / puts it back.
  void pin(PageId id);
  void unpin(PageId id);

  // --- bytes ---
  // Moves a page to another tier. Requires: a free slot there; the page is not LOCKED.
  void move(PageId id, TierIndex dst_tier);
  // Changes a pool's slot count on a tier (runtime quotas). Growing adds slots (used last);
  // shrinking moves every page above the new end into a free slot below it (a copy within the
  // tier) and retires the rest. Requires: at most `total` pages in the pool. Returns the copies'
  // event (flushed).
  CopyEvent resize_pool(TierIndex tier, PoolGroupId pg, uint64_t total);
  // Queues a GPU-to-GPU copy of src's slot into dst's slot (snapshots, partial tails); between
  // a live state and a reduced-precision snapshot of one group it converts. dst becomes ready
  // when the copy completes; src may not be overwritten before then.
  void copy_page(PageId src, PageId dst);
  // Queues a copy of the page's slot bytes (every pool, in order) into `host` (memory from
  // MemoryBackend::host_buffer): readable once the batch's event completes. The page is not
  // held: whoever takes its slot next writes it after the copy; the page itself does not wait.
  // Requires: the page's tier is in memory (not DISK).
  void copy_out(PageId id, std::byte* host);
  // Submits the copies collected since the last flush; returns their event.
  CopyEvent flush();

  const Page& page(PageId id) const { return pages_[id.value]; }
  size_t page_capacity() const { return pages_.size(); }
  IterationStats& stats() { return stats_; }
  // The counters since the last take, then zero (per-group entries kept, one per cache group).
  IterationStats take_stats();

  // Slot ownership is exclusive, free lists and pages agree, queues hold exactly the evictable
  // unpinned pages in (priority, LRU) order. Empty string = fine; else the first broken one.
  std::string check() const;
  // Every page and slot, for before/after comparisons in tests.
  std::string snapshot() const;

 private:
  // One (tier, pool group)'s slots. Bookkeeping grows with the slots ever used, not with the
  // quota: slots [touched, total) were never handed out and are free implicitly, taken in
  // increasing order once the stack of freed slots is empty (the order a stack of every slot,
  // lowest on top, would give). A quota of terabytes costs nothing until it is used.
  struct PoolSlots {
    uint64_t total = 0;
    uint64_t touched = 0;             // slots [0, touched) have per-slot entries below
    std::vector<SlotId> free;         // freed slots below `touched`: a stack
    std::vector<CopyEvent> last_use;  // per touched slot: the last copy that touched it
    std::vector<PageId> occupant;     // per touched slot: the page in it (kNoPage: free)
    std::vector<uint64_t> read_in;    // per touched slot: the last batch that may read it
    CopyEvent untouched_use;          // what a slot not yet touched waits for (a regrown one)
    CopyEvent retired;                // the last copy that touched a slot since retired
    uint64_t victims = 0;             // see Storage::victims
    uint64_t wants = 0;               // see Storage::wants
    bool ever_full = false;           // see Storage::ever_full
    uint64_t copies = 0;              // kept copies: room nothing else needed
    std::unique_ptr<EvictionQueue> held;
    std::unique_ptr<EvictionQueue> droppable;
    PoolSlots(const EvictionPolicy& policy, PageTable* pages, const uint64_t* clock)
        : held(policy.make_queue(pages, QueueKind::kHeld, clock)),
          droppable(policy.make_queue(pages, QueueKind::kDroppable, clock)) {}
    EvictionQueue& queue(QueueKind kind) { return kind == QueueKind::kHeld ? *held : *droppable; }
    const EvictionQueue& queue(QueueKind kind) const {
      return kind == QueueKind::kHeld ? *held : *droppable;
    }
    uint64_t free_count() const { return free.size() + (total - touched); }
    // Requires: free_count() > 0.
    SlotId take();
    // Slots past `total` are gone: freed ones leave the stack, touched ones their entries.
    void cut(uint64_t total);
  };
  struct Tier {
    TierKind kind;
    std::vector<PoolSlots> pools;  // by pool group id
  };

  Page& mutable_page(PageId id) { return pages_[id.value]; }
  PoolSlots& slots(TierIndex tier, PoolGroupId pg) { return tiers_[tier.value].pools[pg.value]; }
  const PoolSlots& slots(TierIndex tier, PoolGroupId pg) const {
    return tiers_[tier.value].pools[pg.value];
  }
  PageId pick_victim(TierIndex tier, PoolGroupId pg, bool room_below) const;
  uint64_t room_below(TierIndex tier, PoolGroupId pg) const;
  // The first tier below `tier` where room for one page of `pg` can be made.
  std::optional<TierIndex> destination_below(TierIndex tier, PoolGroupId pg) const;
  bool worth_moving(const Page& p, TierIndex to) const;
  SlotId take_slot(TierIndex tier, PoolGroupId pg);
  // The page now sits in `slot` of its tier and pool group (Page::slot and the slot's occupant).
  void seat(PageId id, SlotId slot);
  void give_slot(TierIndex tier, PoolGroupId pg, SlotId slot, CopyEvent last_use);
  // Re-derives queue membership after a change; releases a page nobody refers to.
  void refresh(PageId id);
  void dequeue(PageId id);
  // Puts the page in its (tier, pool group)'s queue of `kind` as the most recent entry.
  void enqueue_newest(PageId id, QueueKind kind);
  // After a move between tiers: a page that was queued rejoins, by its state, as the newest.
  void enqueue_moved(PageId id, bool was_queued);
  // Applies `change` to the page's rank and puts it back in its queue as the most recent entry.
  template <typename Change>
  void requeue(PageId id, Change&& change);
  void notify_updated(PageId id);
  void release(PageId id);
  // The page is dead: skip its offload copy if it has not run (counted in the stats).
  void cancel_offload(Page& p);
  // Kept copies (storage/copies.cc; ManagerConfig::policies.keep_colder_copies).
  // The page just went up from (tier, slot): that slot becomes its copy when the page qualifies
  // (a tree page worth keeping), else it is given back.
  void leave_copy_or_free(PageId id, TierIndex tier, SlotId slot);
  // The page goes back to its copy's slot: no transfer; its own slot is freed.
  void return_to_copy(PageId id);
  // The copy page goes (its slot freed); its page no longer has one.
  void release_copy(PageId copy);
  // The copy's page id is recycled (its slot is someone else's now).
  void forget_copy(PageId copy);
  std::string check_copy_links(PageId id) const;
  std::string check_pool(TierIndex tier, const PoolGroup& pg,
                         const std::vector<uint32_t>& page_ids) const;

  StoragePlan plan_;
  memory::MemoryBackend* backend_;
  const EvictionPolicy* eviction_;   // which victim (ManagerConfig::policies.eviction)
  const OffloadPolicy* offload_;     // copy down or drop (ManagerConfig::policies.offload)
  std::vector<PageNotice> notices_;  // see notices()
  std::vector<Tier> tiers_;
  PageTable pages_{1};
  std::vector<PageId> free_pages_;
  uint64_t tick_ = 0;
  IterationStats stats_;
  // Copies since the last flush, with what their event must be recorded on.
  std::vector<memory::SlotCopy> pending_;
  std::vector<PageId> pending_pages_;
  std::vector<PageId> pending_offloads_;  // pages whose offload copy is in pending_
  struct SlotRef {
    TierIndex tier;
    PoolGroupId pg;
    SlotId slot;
  };
  std::vector<SlotRef> pending_slots_;  // slots read by a copy in pending_
  uint64_t batch_ = 1;                  // the batch pending_ builds (PoolSlots::read_in)
  // A copy of the batch being built reads `slot`: whoever writes it next waits for the batch.
  void read_by_batch(TierIndex tier, PoolGroupId pg, SlotId slot);
  // The submitted batch's event on what it reads and writes (offloads, pages, slots).
  void record_batch(CopyEvent event);
};

}  // namespace hybridkv::storage
