// Kept copies (ManagerConfig::policies.keep_colder_copies): a tree page's bytes never change, so
// when one goes up a tier the slot it left can stay as a copy; evicting the page again then costs
// no transfer. A copy is demoted: its tier gives it up before any page whose bytes exist nowhere
// else, so copies only fill room nothing else needs.
#include "storage/storage.h"
#include "util/check.h"
#include "util/dense_table.h"

namespace hybridkv::storage {

void Storage::leave_copy_or_free(PageId id, TierIndex tier, SlotId slot) {
  const CopyEvent written = page(id).ready;  // the copy holds what the page held
  if (page(id).copy_below != kNoPage) release_copy(page(id).copy_below);  // the nearer one stays
  const Page& p = page(id);
  if (!plan_.config().policies.keep_colder_copies || !p.owned() || p.demoted) {
    // The slot is free once this batch has read it.
    give_slot(tier, p.pool_group, slot, written);
    read_by_batch(tier, p.pool_group, slot);
    return;
  }
  const PageId c = take_dense_id(pages_, free_pages_);
  Page& copy = mutable_page(c);
  Page& page_up = mutable_page(id);
  copy = Page{};
  copy.group = page_up.group;
  copy.pool_group = page_up.pool_group;
  copy.tier = tier_kind(tier);
  copy.tier_index = tier;
  copy.live = true;
  copy.priority = page_up.priority;
  copy.demoted = true;
  copy.age_class = page_up.age_class;
  copy.ready = written;
  copy.copy_of = id;
  seat(c, slot);
  page_up.copy_below = c;
  // Not to be overwritten before this batch's onboard has read it.
  pending_pages_.push_back(c);
  enqueue_newest(c, QueueKind::kDroppable);
  ++slots(tier, copy.pool_group).copies;
  stats_.bytes_copies_kept += plan_.pool_group(copy.pool_group).slot_bytes;
}

void Storage::return_to_copy(PageId id) {
  Page& p = mutable_page(id);
  const PageId c = p.copy_below;
  Page& copy = mutable_page(c);
  HKV_CHECK(copy.live && copy.copy_of == id && copy.tier_index > p.tier_index,
            "page %u has no copy below it to return to", id.value);
  const bool was_queued = p.queue != QueueKind::kNone;
  dequeue(id);
  dequeue(c);
  // The page's own slot is free once whatever last touched it (this batch included) is done.
  give_slot(p.tier_index, p.pool_group, p.slot, p.ready);
  read_by_batch(p.tier_index, p.pool_group, p.slot);
  const uint64_t bytes = plan_.pool_group(p.pool_group).slot_bytes;
  ++stats_.pages_returned_to_copy;
  stats_.bytes_returned_to_copy += bytes;
  stats_.tiers[copy.tier_index.value].returned_to_copy_bytes += bytes;
  p.tier = copy.tier;
  p.tier_index = copy.tier_index;
  seat(id, copy.slot);
  p.ready = copy.ready;
  pending_pages_.push_back(id);
  p.copy_below = kNoPage;
  forget_copy(c);
  notify_updated(id);
  enqueue_moved(id, was_queued);  // like a move
}

void Storage::release_copy(PageId c) {
  Page& copy = mutable_page(c);
  HKV_CHECK(copy.live && copy.is_copy(), "page %u is not a kept copy", c.value);
  dequeue(c);
  mutable_page(copy.copy_of).copy_below = kNoPage;
  give_slot(copy.tier_index, copy.pool_group, copy.slot, copy.ready);
  read_by_batch(copy.tier_index, copy.pool_group, copy.slot);
  forget_copy(c);
}

void Storage::forget_copy(PageId c) {
  Page& copy = mutable_page(c);
  --slots(copy.tier_index, copy.pool_group).copies;
  copy.copy_of = kNoPage;
  copy.live = false;
  free_pages_.push_back(c);
}

}  // namespace hybridkv::storage
