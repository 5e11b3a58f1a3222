// Runtime quotas and rebalancing: a pool's slot count changes while pages live
// (KvCacheManager::set_quota, adjust), and the pressure that tells where bytes are worth most.
#include <algorithm>

#include "storage/storage.h"
#include "util/check.h"

namespace hybridkv::storage {

CopyEvent Storage::resize_pool(TierIndex tier, PoolGroupId pg, uint64_t total) {
  PoolSlots& s = slots(tier, pg);
  if (total >= s.total) {
    // New slots are never-touched slots (taken last, lowest first); they wait for whatever last
    // touched a slot before it was retired.
    if (s.retired.ticket > s.untouched_use.ticket) s.untouched_use = s.retired;
    s.total = total;
    return {};
  }
  const uint64_t used = s.total - s.free_count();
  HKV_CHECK(used <= total, "resize_pool: %llu pages do not fit in %llu slots",
            static_cast<unsigned long long>(used), static_cast<unsigned long long>(total));
  // Copies already queued (an offload into a slot about to move) run in an earlier batch.
  flush();
  std::erase_if(s.free, [&](SlotId f) { return f.value >= total; });
  for (uint64_t slot = total; slot < s.touched; ++slot) {
    const PageId id = s.occupant[slot];
    if (id == kNoPage) continue;
    const Page& p = page(id);
    const SlotId dst = take_slot(tier, pg);
    pending_.push_back({pg, std::nullopt, p.tier, p.slot.value, p.tier, dst.value});
    read_by_batch(tier, pg, p.slot);  // the retired slot is read by this batch
    seat(id, dst);
    pending_pages_.push_back(id);
    if (p.tier == TierKind::kGpu) {
      ++stats_.device_copies;
      ++stats_.groups[p.group.value].device_copy_blocks;
      stats_.groups[p.group.value].device_copy_bytes += plan_.pool_group(pg).slot_bytes;
    }
    notify_updated(id);
  }
  const CopyEvent event = flush();
  for (uint64_t i = total; i < s.touched; ++i) {
    if (s.last_use[i].ticket > s.retired.ticket) s.retired = s.last_use[i];
  }
  s.cut(total);
  return event;
}

uint64_t Storage::pressure_age(TierIndex tier, PoolGroupId pg) const {
  const PoolSlots& s = slots(tier, pg);
  const PageId next = s.droppable->front_not_demoted();
  if (next != kNoPage) return page(next).weighted_age(tick_);
  // Kept copies are room nothing else needed: they count as free.
  return (s.free_count() > 0 || s.copies > 0) && s.victims == 0 ? UINT64_MAX : 0;
}

void Storage::reset_victims(TierIndex tier) {
  for (PoolSlots& s : tiers_[tier.value].pools) s.victims = s.wants = 0;
}

}  // namespace hybridkv::storage
