// Storage's own invariants (DESIGN §9) and its before/after snapshot.
#include <algorithm>
#include <sstream>
#include <tuple>
#include <utility>

#include "storage/storage.h"

namespace hybridkv::storage {

std::string Storage::check_pool(TierIndex tier, const PoolGroup& pg,
                                const std::vector<uint32_t>& page_ids) const {
  std::ostringstream err;
  const PoolSlots& s = slots(tier, pg.id);
  const char* tier_name = tier_kind_name(tier_kind(tier));
  if (s.touched > s.total || s.occupant.size() != s.touched || s.last_use.size() != s.touched ||
      s.read_in.size() != s.touched) {
    return std::string(tier_name) + " pool group " + std::to_string(pg.id.value) +
           ": per-slot entries do not match the touched slots";
  }
  std::vector<int> owner(s.touched, 0);
  for (SlotId f : s.free) {
    if (f.value >= s.touched) return "free slot out of range";
    if (owner[f.value]++) return "slot on the free list twice";
    if (s.occupant[f.value] != kNoPage) return "a free slot has an occupant";
  }
  const uint64_t used = page_ids.size();
  for (uint32_t i : page_ids) {
    const Page& p = pages_[i];
    if (p.tier != tier_kind(tier)) return "page " + std::to_string(i) + ": tier kind is off";
    if (p.slot.value >= s.touched || owner[p.slot.value]++ ||
        s.occupant[p.slot.value] != PageId(i)) {
      err << "page " << i << ": slot " << p.slot.value << " on " << tier_name << " pool group "
          << pg.id.value << " is not exclusively its own";
      return err.str();
    }
  }
  if (used + s.free_count() != s.total) {
    err << tier_name << " pool group " << pg.id.value << ": " << used << " used + "
        << s.free_count() << " free != " << s.total << " slots";
    return err.str();
  }
  for (const EvictionQueue* q : {s.held.get(), s.droppable.get()}) {
    const std::vector<PageId> ids = q->pages_in_order();
    if (ids.size() != q->size()) return "queue size does not match its lists";
    const PageState want = q == s.held.get() ? PageState::kHeld : PageState::kDroppable;
    for (size_t k = 0; k < ids.size(); ++k) {
      const Page& p = page(ids[k]);
      if (!p.live || p.pinned || p.state() != want || p.tier_index != tier) {
        err << "page " << ids[k].value << " is in the wrong queue";
        return err.str();
      }
    }
    if (const std::string order = q->check_order(); !order.empty()) {
      err << order << " on " << tier_name << " pool group " << pg.id.value;
      return err.str();
    }
  }
  return "";
}

std::string Storage::check() const {
  // Live pages by (tier, pool group), in one pass.
  const size_t num_pg = plan_.pool_groups().size();
  std::vector<std::vector<uint32_t>> by_pool(tiers_.size() * num_pg);
  for (uint32_t i = 0; i < pages_.size(); ++i) {
    const Page& p = pages_[i];
    if (p.live) by_pool[p.tier_index.value * num_pg + p.pool_group.value].push_back(i);
  }
  for (uint32_t t = 0; t < tiers_.size(); ++t) {
    for (const PoolGroup& pg : plan_.pool_groups()) {
      std::string err = check_pool(TierIndex(t), pg, by_pool[t * num_pg + pg.id.value]);
      if (!err.empty()) return err;
    }
  }
  std::ostringstream err;
  for (uint32_t i = 0; i < pages_.size(); ++i) {
    const Page& p = pages_[i];
    if (!p.live) continue;
    const PageState state = p.state();
    if (state == PageState::kReleased) {
      err << "page " << i << " is live with no holder";
      return err.str();
    }
    if (state == PageState::kLocked && p.tier != TierKind::kGpu) {
      err << "page " << i << " is LOCKED on " << tier_kind_name(p.tier);
      return err.str();
    }
    std::string copy_err = check_copy_links(PageId(i));
    if (!copy_err.empty()) return copy_err;
    const bool evictable = state == PageState::kHeld || state == PageState::kDroppable;
    if ((evictable && !p.pinned) != (p.queue != QueueKind::kNone)) {
      err << "page " << i << " (state " << static_cast<int>(state) << ") queue membership is wrong";
      return err.str();
    }
  }
  return "";
}

// A kept copy and its page point at each other; the copy sits on a colder tier in the same pool
// group, holds nothing, and backs a tree page.
std::string Storage::check_copy_links(PageId id) const {
  const Page& p = page(id);
  const std::string name = "page " + std::to_string(id.value);
  if (p.is_copy()) {
    const Page& o = page(p.copy_of);
    if (!o.live || o.copy_below != id || !o.owned() || o.tier_index >= p.tier_index ||
        o.pool_group != p.pool_group || o.group != p.group)
      return name + " is a copy of page " + std::to_string(p.copy_of.value) + " that is off";
    if (p.owned() || p.active_refs || p.suspended_refs || p.copy_below != kNoPage || !p.demoted)
      return name + " is a copy with holders";
  }
  if (p.copy_below != kNoPage) {
    const Page& c = page(p.copy_below);
    if (!c.live || c.copy_of != id) return name + " points at a copy that is not its own";
  }
  return "";
}

std::string Storage::snapshot() const {
  std::ostringstream os;
  for (uint32_t t = 0; t < tiers_.size(); ++t) {
    for (const PoolGroup& pg : plan_.pool_groups()) {
      const PoolSlots& s = slots(TierIndex(t), pg.id);
      std::vector<uint32_t> free;
      for (SlotId f : s.free) free.push_back(f.value);
      std::sort(free.begin(), free.end());
      os << "tier " << t << " pg " << pg.id.value << " free";
      for (uint32_t f : free) os << " " << f;
      os << " untouched " << s.touched << ".." << s.total;
      os << " held";
      for (PageId id : s.held->pages_in_order()) os << " " << id.value;
      os << " droppable";
      for (PageId id : s.droppable->pages_in_order()) os << " " << id.value;
      os << "\n";
    }
  }
  for (uint32_t i = 0; i < pages_.size(); ++i) {
    const Page& p = pages_[i];
    if (!p.live) continue;
    os << "page " << i << " g" << p.group.value << " " << tier_kind_name(p.tier) << ":"
       << p.slot.value << " a" << p.active_refs << " s" << p.suspended_refs << " t" << p.owned()
       << " pr" << p.priority << (p.demoted ? " demoted" : "");
    if (p.is_copy()) os << " copy_of " << p.copy_of.value;
    if (p.copy_below != kNoPage) os << " copy " << p.copy_below.value;
    os << "\n";
  }
  return os.str();
}

}  // namespace hybridkv::storage
