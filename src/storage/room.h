// Making room: the eviction loop over Storage's one-step plan (next_eviction) and apply
// (evict). It runs outside Storage, so whoever owns pages (the prefix index) hears of each
// drop between two storage calls, never from inside one (no storage loop is on the stack while
// the owner lets other pages go and changes their worth), and each eviction is planned against
// the state the owner's answer to the previous one left.
//
// A victim that moves down is pinned while room is made below for it, so the evictions there
// cannot choose it.
#pragma once

#include <span>

#include "storage/storage.h"

namespace hybridkv::storage {

// Told about pages that have an owner (the prefix index implements it).
class PageOwner {
 public:
  virtual ~PageOwner() = default;
  // The owned page is about to be dropped to make room: the owner forgets it.
  virtual void page_dropping(PageId page, OwnerTag owner, CacheGroupId group) = 0;
  // Owned pages moved to another tier or had their priority set (Storage::notices).
  virtual void pages_updated(std::span<const PageNotice> notices) = 0;
};

// Requires: storage.max_room(tier, pg) >= n. Evicts until n slots are free.
void make_room(Storage& storage, TierIndex tier, PoolGroupId pg, uint64_t n, PageOwner& owner);
// Hands the storage's notices to their owner and clears them.
void deliver_notices(Storage& storage, PageOwner& owner);

}  // namespace hybridkv::storage
