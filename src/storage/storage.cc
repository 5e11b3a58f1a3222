#include "storage/storage.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "util/check.h"
#include "util/dense_table.h"

namespace hybridkv::storage {

Storage::Storage(const StoragePlan& plan, memory::MemoryBackend* backend)
    : plan_(plan),
      backend_(backend),
      eviction_(find_eviction_policy(plan.config().policies.eviction).value()),
      offload_(find_offload_policy(plan.config().policies.offload).value()) {
  stats_.groups.resize(plan_.cache_groups().size());
  stats_.tiers.resize(plan_.tiers().size());
  for (const TierPlan& t : plan_.tiers()) {
    Tier tier{t.kind, {}};
    tier.pools.reserve(plan_.pool_groups().size());
    for (const PoolGroup& pg : plan_.pool_groups()) {
      PoolSlots s(*eviction_, &pages_, &tick_);
      s.total = t.slots[pg.id.value];
      tier.pools.push_back(std::move(s));
    }
    tiers_.push_back(std::move(tier));
  }
}

uint64_t age_factor_256(uint8_t age_class) {
  // 256 * 2^((c - kNeutralAgeClass) / 4), rounded.
  static constexpr uint16_t kFactors[kAgeClasses] = {128,  152,  181,  215,  256,  304,
                                                     362,  431,  512,  609,  724,  861,
                                                     1024, 1218, 1448, 1722, 2048, 2435};
  return kFactors[age_class];
}

uint8_t age_class_for(double factor) {
  uint8_t best = 0;
  for (uint8_t c = 1; c < kAgeClasses; ++c) {
    if (std::abs(static_cast<double>(age_factor_256(c)) / 256 - factor) <
        std::abs(static_cast<double>(age_factor_256(best)) / 256 - factor))
      best = c;
  }
  return best;
}

Exclusions Storage::empty_exclusions() const {
  return Exclusions(tiers_.size(), std::vector<uint64_t>(plan_.pool_groups().size(), 0));
}

void Storage::exclude(Exclusions& excluded, const Page& p) const {
  if (p.queue != QueueKind::kNone) ++excluded[p.tier_index.value][p.pool_group.value];
}

Storage::SlotCounts Storage::counts(TierIndex tier, PoolGroupId pg) const {
  const PoolSlots& s = slots(tier, pg);
  return {s.total, s.free_count(), s.held->size() + s.droppable->size()};
}

uint64_t Storage::max_room(TierIndex tier, PoolGroupId pg, uint64_t own) const {
  const PoolSlots& s = slots(tier, pg);
  const uint64_t held = s.held->size() - std::min<uint64_t>(s.held->size(), own);
  return s.free_count() + s.droppable->size() + std::min(held, room_below(tier, pg));
}

// Room for pages from above on the tiers below `tier`: a page moves to the first tier below
// with room, skipping a full one (its own HELD pages need not move for that), so every free or
// DROPPABLE slot below counts.
uint64_t Storage::room_below(TierIndex tier, PoolGroupId pg) const {
  uint64_t room = 0;
  for (uint32_t t = tier.value + 1; t < tiers_.size(); ++t) {
    const PoolSlots& s = slots(TierIndex(t), pg);
    room += s.free_count() + s.droppable->size();
  }
  return room;
}

std::optional<TierIndex> Storage::destination_below(TierIndex tier, PoolGroupId pg) const {
  for (uint32_t t = tier.value + 1; t < tiers_.size(); ++t) {
    if (max_room(TierIndex(t), pg) >= 1) return TierIndex(t);
  }
  return std::nullopt;
}

// The cheaper of the two queue fronts: lower rank first, then least recently used.
PageId Storage::pick_victim(TierIndex tier, PoolGroupId pg, bool room_below) const {
  const PoolSlots& s = slots(tier, pg);
  const PageId held = room_below ? s.held->front() : kNoPage;
  const PageId droppable = s.droppable->front();
  if (held == kNoPage || droppable == kNoPage) return held != kNoPage ? held : droppable;
  return eviction_->evicted_before(page(held), page(droppable), tick_) ? held : droppable;
}

std::optional<Eviction> Storage::next_eviction(TierIndex tier, PoolGroupId pg, uint64_t n) const {
  if (slots(tier, pg).free_count() >= n) return std::nullopt;
  const std::optional<TierIndex> below = destination_below(tier, pg);
  const PageId victim = pick_victim(tier, pg, below.has_value());
  HKV_CHECK(victim != kNoPage, "make_room(%s, pool group %u, %llu): no victim left",
            tier_kind_name(tier_kind(tier)), pg.value, static_cast<unsigned long long>(n));
  const Page& v = page(victim);
  Eviction e{victim, Eviction::Action::kDrop, tier, tier, !v.demoted};
  if (v.is_copy()) {
    e.action = Eviction::Action::kReleaseCopy;
  } else if (v.copy_below != kNoPage && worth_moving(v, page(v.copy_below).tier_index)) {
    e.action = Eviction::Action::kReturnToCopy;
  } else if (below && worth_moving(v, *below)) {
    e.action = Eviction::Action::kMoveDown;
    e.below = *below;
  } else if (below && offload_->admit(v, {1, slots(*below, v.pool_group).total})) {
    e.short_below = true;
    e.below = *below;
  }
  return e;
}

void Storage::evict(const Eviction& e) {
  PoolSlots& s = slots(e.tier, page(e.victim).pool_group);
  if (e.counted) {
    ++s.victims;
    s.ever_full = true;
  }
  if (e.short_below) ++slots(e.below, page(e.victim).pool_group).wants;
  switch (e.action) {
    case Eviction::Action::kReleaseCopy:
      release_copy(e.victim);
      break;
    case Eviction::Action::kReturnToCopy:
      return_to_copy(e.victim);
      break;
    case Eviction::Action::kMoveDown:
      move(e.victim, e.below);
      break;
    case Eviction::Action::kDrop:
      drop_owned(e.victim);
      break;
  }
}

// A HELD page always moves down; a DROPPABLE one when the offload policy admits it to `to`.
bool Storage::worth_moving(const Page& p, TierIndex to) const {
  if (p.state() == PageState::kHeld) return true;
  const PoolSlots& s = slots(to, p.pool_group);
  return offload_->admit(p, {s.free_count(), s.total});
}

SlotId Storage::take_slot(TierIndex tier, PoolGroupId pg) {
  PoolSlots& s = slots(tier, pg);
  HKV_CHECK(s.free_count() > 0, "no free slot on %s pool group %u", tier_kind_name(tier_kind(tier)),
            pg.value);
  return s.take();
}

SlotId Storage::PoolSlots::take() {
  if (!free.empty()) {
    const SlotId slot = free.back();
    free.pop_back();
    return slot;
  }
  last_use.push_back(untouched_use);
  occupant.push_back(kNoPage);
  read_in.push_back(0);
  return SlotId(static_cast<uint32_t>(touched++));
}

void Storage::PoolSlots::cut(uint64_t new_total) {
  std::erase_if(free, [&](SlotId f) { return f.value >= new_total; });
  if (touched > new_total) {
    touched = new_total;
    last_use.resize(touched);
    occupant.resize(touched);
    read_in.resize(touched);
  }
  total = new_total;
}

void Storage::give_slot(TierIndex tier, PoolGroupId pg, SlotId slot, CopyEvent last_use) {
  PoolSlots& s = slots(tier, pg);
  if (last_use.ticket > s.last_use[slot.value].ticket) s.last_use[slot.value] = last_use;
  s.occupant[slot.value] = kNoPage;
  s.free.push_back(slot);
}

void Storage::seat(PageId id, SlotId slot) {
  Page& p = mutable_page(id);
  p.slot = slot;
  slots(p.tier_index, p.pool_group).occupant[slot.value] = id;
}

PageId Storage::allocate(CacheGroupId group, TierIndex tier, int32_t priority, bool snapshot) {
  const PoolGroupId pg = plan_.cache_group(group).page_pool_group(snapshot);
  const SlotId slot = take_slot(tier, pg);
  const PageId id = take_dense_id(pages_, free_pages_);
  Page& p = mutable_page(id);
  p.group = group;
  p.pool_group = pg;
  p.tier = tier_kind(tier);
  p.tier_index = tier;
  p.live = true;
  seat(id, slot);
  p.priority = priority;
  p.demoted = false;
  p.hits = 0;
  p.copy_below = kNoPage;
  p.copy_of = kNoPage;
  // The new owner writes the slot only after whatever last touched it, including a copy of this
  // operation that reads the slot and is not submitted yet.
  p.ready = slots(tier, pg).last_use[slot.value];
  if (slots(tier, pg).read_in[slot.value] == batch_) pending_pages_.push_back(id);
  ++stats_.pages_allocated;
  ++stats_.groups[group.value].new_blocks;
  return id;
}

void Storage::add_ref(PageId id, Ref ref) {
  Page& p = mutable_page(id);
  HKV_CHECK(p.live, "add_ref on released page %u", id.value);
  HKV_CHECK(ref != Ref::kActive || p.tier == TierKind::kGpu, "page %u locked off the GPU",
            id.value);
  ++(ref == Ref::kActive ? p.active_refs : p.suspended_refs);
  refresh(id);
}

void Storage::drop_ref(PageId id, Ref ref) {
  Page& p = mutable_page(id);
  uint32_t& count = ref == Ref::kActive ? p.active_refs : p.suspended_refs;
  HKV_CHECK(p.live && count > 0, "drop_ref on page %u without such a reference", id.value);
  --count;
  refresh(id);
}

void Storage::convert_ref(PageId id, Ref from, Ref to) {
  Page& p = mutable_page(id);
  uint32_t& src = from == Ref::kActive ? p.active_refs : p.suspended_refs;
  HKV_CHECK(p.live && src > 0, "convert_ref on page %u without such a reference", id.value);
  HKV_CHECK(to != Ref::kActive || p.tier == TierKind::kGpu, "page %u locked off the GPU", id.value);
  --src;
  ++(to == Ref::kActive ? p.active_refs : p.suspended_refs);
  refresh(id);
}

void Storage::set_owner(PageId id, OwnerTag owner) {
  Page& p = mutable_page(id);
  HKV_CHECK(p.live && !p.owned() && owner != kNoOwner, "page %u cannot take owner %u", id.value,
            owner);
  p.owner = owner;
  refresh(id);
}

void Storage::clear_owner(PageId id) {
  Page& p = mutable_page(id);
  HKV_CHECK(p.live && p.owned(), "page %u has no owner to clear", id.value);
  set_demoted(id, false);  // the owner's verdict ends with its ownership
  if (p.copy_below != kNoPage) release_copy(p.copy_below);  // no longer a tree page
  p.owner = kNoOwner;
  refresh(id);
}

void Storage::notify_updated(PageId id) {
  const Page& p = page(id);
  if (p.owned()) notices_.push_back({id, p.owner, p.group, p.tier, p.priority});
}

void Storage::set_priority(PageId id, int32_t priority) {
  Page& p = mutable_page(id);
  if (p.priority != priority) requeue(id, [&] { p.priority = priority; });
  notify_updated(id);
}

void Storage::set_demoted(PageId id, bool demoted) {
  Page& p = mutable_page(id);
  if (p.demoted != demoted) requeue(id, [&] { p.demoted = demoted; });
}

void Storage::set_age_class(PageId id, uint8_t age_class) {
  HKV_CHECK(age_class < kAgeClasses, "age class %u of page %u is out of range", age_class,
            id.value);
  Page& p = mutable_page(id);
  if (p.age_class != age_class) requeue(id, [&] { p.age_class = age_class; });
}

void Storage::note_hit(PageId id) {
  Page& p = mutable_page(id);
  if (p.hits < UINT32_MAX) ++p.hits;
}

void Storage::touch(PageId id) {
  requeue(id, [] {});
}

template <typename Change>
void Storage::requeue(PageId id, Change&& change) {
  Page& p = mutable_page(id);
  const QueueKind queued = p.queue;
  if (queued != QueueKind::kNone) dequeue(id);
  change();
  // It joins its new rank's bucket as the most recent entry (keeps buckets in LRU order).
  if (queued != QueueKind::kNone) enqueue_newest(id, queued);
}

void Storage::dequeue(PageId id) {
  Page& p = mutable_page(id);
  if (p.queue == QueueKind::kNone) return;
  slots(p.tier_index, p.pool_group).queue(p.queue).remove(id);
  p.queue = QueueKind::kNone;
}

void Storage::enqueue_newest(PageId id, QueueKind kind) {
  Page& p = mutable_page(id);
  p.lru_tick = ++tick_;
  slots(p.tier_index, p.pool_group).queue(kind).push_back(id);
  p.queue = kind;
}

// A moved page re-enters the colder (or warmer) tier's queue as its most recent entry.
void Storage::enqueue_moved(PageId id, bool was_queued) {
  if (!was_queued) return;
  enqueue_newest(id,
                 page(id).state() == PageState::kHeld ? QueueKind::kHeld : QueueKind::kDroppable);
}

IterationStats Storage::take_stats() {
  IterationStats fresh;
  fresh.groups.resize(plan_.cache_groups().size());
  fresh.tiers.resize(plan_.tiers().size());
  return std::exchange(stats_, std::move(fresh));
}

void Storage::pin(PageId id) {
  dequeue(id);
  mutable_page(id).pinned = true;
}

void Storage::unpin(PageId id) {
  mutable_page(id).pinned = false;
  refresh(id);
}

void Storage::refresh(PageId id) {
  Page& p = mutable_page(id);
  const PageState state = p.state();
  if (state == PageState::kReleased) {
    dequeue(id);
    release(id);
    return;
  }
  QueueKind want = QueueKind::kNone;
  if (!p.pinned && state == PageState::kHeld) want = QueueKind::kHeld;
  if (!p.pinned && state == PageState::kDroppable) want = QueueKind::kDroppable;
  if (p.queue == want) return;
  dequeue(id);
  if (want != QueueKind::kNone) enqueue_newest(id, want);
}

void Storage::drop_owned(PageId id) {
  Page& p = mutable_page(id);
  HKV_CHECK(p.state() == PageState::kDroppable, "page %u dropped while not DROPPABLE", id.value);
  ++stats_.pages_dropped;
  ++stats_.groups[p.group.value].evicted_blocks;
  p.owner = kNoOwner;
  refresh(id);
}

void Storage::release(PageId id) {
  Page& p = mutable_page(id);
  HKV_CHECK(p.live && p.active_refs == 0 && p.suspended_refs == 0 && !p.owned(),
            "page %u released while referenced", id.value);
  if (p.copy_below != kNoPage) release_copy(p.copy_below);
  cancel_offload(p);
  give_slot(p.tier_index, p.pool_group, p.slot, p.ready);
  p.live = false;
  free_pages_.push_back(id);
}

}  // namespace hybridkv::storage
