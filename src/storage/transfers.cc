// Copies between slots: a page's move to another tier, a GPU page copied into another (a
// reduced-precision snapshot converts on the way), a page read out to the host, and the batch
// they are collected in until flush() hands it to the backend. A page released before the copy
// of its last move down ran has that copy cancelled.
#include "storage/storage.h"
#include "util/check.h"

namespace hybridkv::storage {

void Storage::move(PageId id, TierIndex dst_tier) {
  Page& p = mutable_page(id);
  HKV_CHECK(p.state() != PageState::kLocked, "page %u is LOCKED and cannot move", id.value);
  HKV_CHECK(!p.is_copy(), "page %u is a kept copy: copies never move", id.value);
  HKV_CHECK(dst_tier < p.tier_index || p.copy_below == kNoPage,
            "page %u has a copy below: it returns to it, it is not copied down", id.value);
  const TierIndex src_tier = p.tier_index;
  const bool was_queued = p.queue != QueueKind::kNone;
  dequeue(id);
  const SlotId dst_slot = take_slot(dst_tier, p.pool_group);
  p.offload_pending = UINT32_MAX;
  p.offload_event = CopyEvent{};
  if (src_tier < dst_tier) {
    p.offload_pending = static_cast<uint32_t>(pending_.size());
    pending_offloads_.push_back(id);
  }
  pending_.push_back(
      {p.pool_group, std::nullopt, p.tier, p.slot.value, tier_kind(dst_tier), dst_slot.value});
  const uint64_t bytes = plan_.pool_group(p.pool_group).slot_bytes;
  GroupIterationStats& gs = stats_.groups[p.group.value];
  if (dst_tier < src_tier) {
    ++stats_.pages_onboarded;
    stats_.bytes_onboarded += bytes;
    ++gs.onboarded_blocks;
    gs.onboarded_bytes += bytes;
    stats_.tiers[src_tier.value].onboarded_bytes += bytes;
  } else {
    ++stats_.pages_offloaded;
    stats_.bytes_offloaded += bytes;
    ++gs.offloaded_blocks;
    gs.offloaded_bytes += bytes;
    stats_.tiers[dst_tier.value].offloaded_bytes += bytes;
  }
  const SlotId src_slot = p.slot;
  const CopyEvent src_ready = p.ready;
  p.tier = tier_kind(dst_tier);
  p.tier_index = dst_tier;
  seat(id, dst_slot);
  // The copy must also wait for whoever last used the destination slot: copies run in order.
  pending_pages_.push_back(id);
  if (dst_tier < src_tier) {
    leave_copy_or_free(id, src_tier, src_slot);  // may grow the page table
  } else {
    // The source slot is free once this batch has read it.
    give_slot(src_tier, p.pool_group, src_slot, src_ready);
    read_by_batch(src_tier, p.pool_group, src_slot);
  }
  notify_updated(id);
  enqueue_moved(id, was_queued);
}

void Storage::copy_page(PageId src, PageId dst) {
  const Page& s = page(src);
  const Page& d = page(dst);
  HKV_CHECK(s.group == d.group && s.tier == TierKind::kGpu && d.tier == TierKind::kGpu,
            "copy_page %u -> %u: not two GPU pages of one cache group", src.value, dst.value);
  std::optional<PoolGroupId> converted;
  if (d.pool_group != s.pool_group) converted = d.pool_group;
  pending_.push_back({s.pool_group, converted, s.tier, s.slot.value, d.tier, d.slot.value});
  // Both get the batch's event: dst is written by it, src must not be overwritten before it.
  pending_pages_.push_back(dst);
  pending_pages_.push_back(src);
  ++stats_.device_copies;
  ++stats_.groups[s.group.value].device_copy_blocks;
  stats_.groups[s.group.value].device_copy_bytes += plan_.pool_group(d.pool_group).slot_bytes;
}

void Storage::copy_out(PageId id, std::byte* host) {
  const Page& p = page(id);
  HKV_CHECK(p.live && p.tier != TierKind::kDisk, "copy_out of page %u: not in memory", id.value);
  memory::SlotCopy c{p.pool_group, std::nullopt, p.tier, p.slot.value, p.tier, p.slot.value};
  c.dst_host = host;
  pending_.push_back(c);
  read_by_batch(p.tier_index, p.pool_group, p.slot);
}

void Storage::cancel_offload(Page& p) {
  bool cancelled = false;
  if (p.offload_pending != UINT32_MAX) {
    pending_[p.offload_pending].cancelled = true;
    cancelled = true;
  } else if (p.offload_event.ticket != 0) {
    cancelled = backend_->cancel(p.offload_event, p.offload_index);
  }
  p.offload_pending = UINT32_MAX;
  p.offload_event = CopyEvent{};
  if (!cancelled) return;
  const uint64_t bytes = plan_.pool_group(p.pool_group).slot_bytes;
  ++stats_.pages_offload_cancelled;
  stats_.bytes_offload_cancelled += bytes;
  stats_.tiers[p.tier_index.value].offload_cancelled_bytes += bytes;
}

CopyEvent Storage::flush() {
  CopyEvent event;
  if (!pending_.empty()) {
    const size_t n = pending_.size();
    event = backend_->submit(std::move(pending_));
    pending_.clear();
    pending_.reserve(n);  // the next batch is likely as large: one allocation, not a doubling
    record_batch(event);
  }
  // A batch without copies read no slot and wrote no page: nothing waits for it.
  pending_offloads_.clear();
  pending_pages_.clear();
  pending_slots_.clear();
  ++batch_;
  return event;
}

void Storage::record_batch(CopyEvent event) {
  for (PageId id : pending_offloads_) {
    Page& p = mutable_page(id);
    if (!p.live || p.offload_pending == UINT32_MAX) continue;
    p.offload_event = event;
    p.offload_index = p.offload_pending;
    p.offload_pending = UINT32_MAX;
  }
  for (PageId id : pending_pages_) {
    if (page(id).live) mutable_page(id).ready = event;
  }
  for (const SlotRef& s : pending_slots_) {
    CopyEvent& e = slots(s.tier, s.pg).last_use[s.slot.value];
    if (event.ticket > e.ticket) e = event;
  }
}

void Storage::read_by_batch(TierIndex tier, PoolGroupId pg, SlotId slot) {
  pending_slots_.push_back({tier, pg, slot});
  slots(tier, pg).read_in[slot.value] = batch_;
}

}  // namespace hybridkv::storage
