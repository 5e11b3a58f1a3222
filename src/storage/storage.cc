#include "storage/storage.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "util/check.h"

namespace hybridkv::storage {

Storage::Storage(const StoragePlan& plan, memory::MemoryBackend* backend)
    : plan_(plan), backend_(backend) {
  for (const TierPlan& t : plan_.tiers()) {
    Tier tier{t.kind, {}};
    tier.pools.reserve(plan_.pool_groups().size());
    for (const PoolGroup& pg : plan_.pool_groups()) {
      PoolSlots s(&pages_);
      s.total = t.slots[pg.id.value];
      s.free.reserve(s.total);
      for (uint64_t i = s.total; i > 0; --i) s.free.push_back(static_cast<uint32_t>(i - 1));
      s.last_use.assign(s.total, CopyEvent{});
      tier.pools.push_back(std::move(s));
    }
    tiers_.push_back(std::move(tier));
  }
}

Exclusions Storage::empty_exclusions() const {
  return Exclusions(tiers_.size(), std::vector<uint64_t>(plan_.pool_groups().size(), 0));
}

size_t Storage::tier_index(TierKind kind) const {
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (tiers_[i].kind == kind) return i;
  }
  HKV_CHECK(false, "tier %s not configured", tier_kind_name(kind));
  return 0;
}

uint64_t Storage::total_slots(size_t tier, PoolGroupId pg) const { return slots(tier, pg).total; }
uint64_t Storage::free_slots(size_t tier, PoolGroupId pg) const {
  return slots(tier, pg).free.size();
}
uint64_t Storage::evictable_slots(size_t tier, PoolGroupId pg) const {
  return slots(tier, pg).held.size() + slots(tier, pg).droppable.size();
}

uint64_t Storage::max_room(size_t tier, PoolGroupId pg, const Exclusions& excluded) const {
  const PoolSlots& s = slots(tier, pg);
  const uint64_t held = s.held.size() - std::min<uint64_t>(s.held.size(), excluded[tier][pg.value]);
  const uint64_t below = tier + 1 < tiers_.size() ? max_room(tier + 1, pg, excluded) : 0;
  return s.free.size() + s.droppable.size() + std::min(held, below);
}

void Storage::make_room(size_t tier, PoolGroupId pg, uint64_t n) {
  const Exclusions none = empty_exclusions();
  PoolSlots& s = slots(tier, pg);
  while (s.free.size() < n) {
    const bool last = tier + 1 == tiers_.size();
    const bool room_below = !last && max_room(tier + 1, pg, none) >= 1;
    PageId held = room_below ? s.held.front() : kNoPage;
    PageId droppable = s.droppable.front();
    PageId victim = kNoPage;
    if (held != kNoPage && droppable != kNoPage) {
      const Page& h = pages_[held];
      const Page& d = pages_[droppable];
      victim =
          std::tie(h.priority, h.lru_tick) < std::tie(d.priority, d.lru_tick) ? held : droppable;
    } else {
      victim = held != kNoPage ? held : droppable;
    }
    HKV_CHECK(victim != kNoPage, "make_room(%s, pool group %u, %llu): no victim left",
              tier_kind_name(tiers_[tier].kind), pg.value, static_cast<unsigned long long>(n));
    if (room_below) {
      make_room(tier + 1, pg, 1);
      move(victim, tier + 1);
    } else {
      drop(victim);
    }
  }
}

uint32_t Storage::take_slot(size_t tier, PoolGroupId pg) {
  PoolSlots& s = slots(tier, pg);
  HKV_CHECK(!s.free.empty(), "no free slot on %s pool group %u", tier_kind_name(tiers_[tier].kind),
            pg.value);
  const uint32_t slot = s.free.back();
  s.free.pop_back();
  return slot;
}

void Storage::give_slot(size_t tier, PoolGroupId pg, uint32_t slot, CopyEvent last_use) {
  PoolSlots& s = slots(tier, pg);
  if (last_use.ticket > s.last_use[slot].ticket) s.last_use[slot] = last_use;
  s.free.push_back(slot);
}

PageId Storage::allocate(CacheGroupId group, size_t tier) {
  const PoolGroupId pg = plan_.cache_group(group).pool_group;
  const uint32_t slot = take_slot(tier, pg);
  PageId id;
  if (!free_pages_.empty()) {
    id = free_pages_.back();
    free_pages_.pop_back();
  } else {
    id = static_cast<PageId>(pages_.size());
    pages_.emplace_back();
  }
  Page& p = pages_[id];
  p = Page{};
  p.group = group;
  p.pool_group = pg;
  p.tier = tiers_[tier].kind;
  p.slot = slot;
  p.live = true;
  // The new owner writes the slot only after whatever last touched it, including a copy of this
  // operation that reads the slot and is not submitted yet.
  p.ready = slots(tier, pg).last_use[slot];
  for (const SlotRef& s : pending_slots_) {
    if (s.tier == tier && s.pg == pg && s.slot == slot) pending_pages_.push_back(id);
  }
  ++stats.pages_allocated;
  return id;
}

void Storage::move(PageId id, size_t dst_tier) {
  Page& p = pages_[id];
  HKV_CHECK(p.state() != PageState::kLocked, "page %u is LOCKED and cannot move", id);
  const size_t src_tier = tier_index(p.tier);
  const bool was_queued = p.queue != QueueKind::kNone;
  if (was_queued) {
    PoolSlots& s = slots(src_tier, p.pool_group);
    (p.queue == QueueKind::kHeld ? s.held : s.droppable).remove(id);
  }
  const uint32_t dst_slot = take_slot(dst_tier, p.pool_group);
  pending_.push_back({p.pool_group, p.tier, p.slot, tiers_[dst_tier].kind, dst_slot});
  const uint64_t bytes = plan_.pool_group(p.pool_group).slot_bytes;
  if (dst_tier < src_tier) {
    ++stats.pages_onboarded;
    stats.bytes_onboarded += bytes;
  } else {
    ++stats.pages_offloaded;
    stats.bytes_offloaded += bytes;
  }
  // The source slot is free once this batch has read it.
  give_slot(src_tier, p.pool_group, p.slot, p.ready);
  pending_slots_.push_back({src_tier, p.pool_group, p.slot});
  p.tier = tiers_[dst_tier].kind;
  p.slot = dst_slot;
  // The copy must also wait for whoever last used the destination slot: copies run in order.
  pending_pages_.push_back(id);
  if (on_move) on_move(id);
  if (was_queued) {
    // A moved page keeps its age: it re-enters the colder queue as the most recent entry.
    p.lru_tick = ++tick_;
    PoolSlots& d = slots(dst_tier, p.pool_group);
    (p.state() == PageState::kHeld ? d.held : d.droppable).push_back(id);
  }
}

void Storage::copy_page(PageId src, PageId dst) {
  Page& s = pages_[src];
  Page& d = pages_[dst];
  HKV_CHECK(s.pool_group == d.pool_group && s.tier == TierKind::kGpu && d.tier == TierKind::kGpu,
            "copy_page %u -> %u: not two GPU pages of one pool group", src, dst);
  pending_.push_back({s.pool_group, s.tier, s.slot, d.tier, d.slot});
  // Both get the batch's event: dst is written by it, src must not be overwritten before it.
  pending_pages_.push_back(dst);
  pending_pages_.push_back(src);
  ++stats.device_copies;
}

void Storage::pin(PageId id) {
  Page& p = pages_[id];
  if (p.queue != QueueKind::kNone) {
    PoolSlots& s = slots(tier_index(p.tier), p.pool_group);
    (p.queue == QueueKind::kHeld ? s.held : s.droppable).remove(id);
  }
  p.pinned = true;
}

void Storage::unpin(PageId id) {
  pages_[id].pinned = false;
  refresh(id);
}

void Storage::refresh(PageId id) {
  Page& p = pages_[id];
  const PageState state = p.state();
  if (state == PageState::kReleased) {
    if (p.queue != QueueKind::kNone) {
      PoolSlots& s = slots(tier_index(p.tier), p.pool_group);
      (p.queue == QueueKind::kHeld ? s.held : s.droppable).remove(id);
    }
    release(id);
    return;
  }
  QueueKind want = QueueKind::kNone;
  if (!p.pinned && state == PageState::kHeld) want = QueueKind::kHeld;
  if (!p.pinned && state == PageState::kDroppable) want = QueueKind::kDroppable;
  if (p.queue == want) return;
  PoolSlots& s = slots(tier_index(p.tier), p.pool_group);
  if (p.queue != QueueKind::kNone) (p.queue == QueueKind::kHeld ? s.held : s.droppable).remove(id);
  if (want != QueueKind::kNone) {
    p.lru_tick = ++tick_;
    (want == QueueKind::kHeld ? s.held : s.droppable).push_back(id);
  }
}

void Storage::set_priority(PageId id, int32_t priority) {
  Page& p = pages_[id];
  if (p.priority == priority) return;
  const QueueKind queued = p.queue;
  PoolSlots& s = slots(tier_index(p.tier), p.pool_group);
  if (queued != QueueKind::kNone) (queued == QueueKind::kHeld ? s.held : s.droppable).remove(id);
  p.priority = priority;
  if (queued != QueueKind::kNone) (queued == QueueKind::kHeld ? s.held : s.droppable).push_back(id);
}

void Storage::drop(PageId id) {
  Page& p = pages_[id];
  HKV_CHECK(p.state() == PageState::kDroppable, "page %u dropped while not DROPPABLE", id);
  if (on_drop) on_drop(id);
  ++stats.pages_dropped;
  p.in_tree = false;
  refresh(id);
}

void Storage::release(PageId id) {
  Page& p = pages_[id];
  HKV_CHECK(p.live && p.active_refs == 0 && p.suspended_refs == 0 && !p.in_tree,
            "page %u released while referenced", id);
  give_slot(tier_index(p.tier), p.pool_group, p.slot, p.ready);
  p.live = false;
  free_pages_.push_back(id);
}

CopyEvent Storage::flush() {
  if (pending_.empty()) return {};
  const CopyEvent event = backend_->submit(std::move(pending_));
  pending_.clear();
  for (PageId id : pending_pages_) {
    if (pages_[id].live) pages_[id].ready = event;
  }
  for (const SlotRef& s : pending_slots_) {
    CopyEvent& e = slots(s.tier, s.pg).last_use[s.slot];
    if (event.ticket > e.ticket) e = event;
  }
  pending_pages_.clear();
  pending_slots_.clear();
  return event;
}

std::byte* Storage::slot_address(TierKind tier, PoolGroupId pg, uint32_t pool,
                                 uint32_t slot) const {
  std::byte* base = backend_->pool_base(tier, pg, pool);
  if (base == nullptr) return nullptr;
  return base + static_cast<uint64_t>(slot) * plan_.pool_group(pg).pools[pool].slot_bytes;
}

std::string Storage::check() const {
  std::ostringstream err;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    for (const PoolGroup& pg : plan_.pool_groups()) {
      const PoolSlots& s = slots(t, pg.id);
      std::vector<int> owner(s.total, 0);
      for (uint32_t f : s.free) {
        if (f >= s.total) return "free slot out of range";
        if (owner[f]++) return "slot on the free list twice";
      }
      uint64_t used = 0;
      for (PageId id = 0; id < pages_.size(); ++id) {
        const Page& p = pages_[id];
        if (!p.live || p.tier != tiers_[t].kind || p.pool_group != pg.id) continue;
        ++used;
        if (p.slot >= s.total || owner[p.slot]++) {
          err << "page " << id << ": slot " << p.slot << " on " << tier_kind_name(p.tier)
              << " pool group " << pg.id.value << " is not exclusively its own";
          return err.str();
        }
      }
      if (used + s.free.size() != s.total) {
        err << tier_kind_name(tiers_[t].kind) << " pool group " << pg.id.value << ": " << used
            << " used + " << s.free.size() << " free != " << s.total << " slots";
        return err.str();
      }
      for (const EvictionQueue* q : {&s.held, &s.droppable}) {
        const std::vector<PageId> ids = q->pages_in_order();
        if (ids.size() != q->size()) return "queue size does not match its lists";
        for (PageId id : ids) {
          const Page& p = pages_[id];
          const PageState want = q == &s.held ? PageState::kHeld : PageState::kDroppable;
          if (!p.live || p.pinned || p.state() != want || p.tier != tiers_[t].kind) {
            err << "page " << id << " is in the wrong queue";
            return err.str();
          }
        }
      }
    }
  }
  for (PageId id = 0; id < pages_.size(); ++id) {
    const Page& p = pages_[id];
    if (!p.live) continue;
    if (p.state() == PageState::kReleased) {
      err << "page " << id << " is live with no holder";
      return err.str();
    }
    if (p.state() == PageState::kLocked && p.tier != TierKind::kGpu) {
      err << "page " << id << " is LOCKED on " << tier_kind_name(p.tier);
      return err.str();
    }
    const bool evictable = p.state() == PageState::kHeld || p.state() == PageState::kDroppable;
    if ((evictable && !p.pinned) != (p.queue != QueueKind::kNone)) {
      err << "page " << id << " (state " << static_cast<int>(p.state())
          << ") queue membership is wrong";
      return err.str();
    }
  }
  return "";
}

std::string Storage::snapshot() const {
  std::ostringstream os;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    for (const PoolGroup& pg : plan_.pool_groups()) {
      const PoolSlots& s = slots(t, pg.id);
      std::vector<uint32_t> free = s.free;
      std::sort(free.begin(), free.end());
      os << "tier " << t << " pg " << pg.id.value << " free";
      for (uint32_t f : free) os << " " << f;
      os << " held";
      for (PageId id : s.held.pages_in_order()) os << " " << id;
      os << " droppable";
      for (PageId id : s.droppable.pages_in_order()) os << " " << id;
      os << "\n";
    }
  }
  for (PageId id = 0; id < pages_.size(); ++id) {
    const Page& p = pages_[id];
    if (!p.live) continue;
    os << "page " << id << " g" << p.group.value << " " << tier_kind_name(p.tier) << ":" << p.slot
       << " a" << p.active_refs << " s" << p.suspended_refs << " t" << p.in_tree << " pr"
       << p.priority << "\n";
  }
  return os.str();
}

}  // namespace hybridkv::storage
