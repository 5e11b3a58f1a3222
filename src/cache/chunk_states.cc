// States inside a step (issue 35 item 1): a kernel that computes the recurrent state at points
// inside a prefill chunk (a chunked scan has it at every chunk boundary) writes it into pages
// reserved here, and a commit that ends at such a point publishes it as the snapshot there.
// Without them a snapshot is exact only at history, so every snapshot point had to end a chunk.
// Reservations are LOCKED pages of the cache (like SWA scratch), released by the commit that
// passes them, by the next reserve_states, and by suspend and close.
#include <algorithm>

#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

using storage::Ref;

Status ManagerCore::check_reserve(const CacheRecord& rec, std::span<const uint64_t> points) const {
  const uint32_t tpb = plan_.config().tokens_per_block;
  if (rec.beam_width != 1) {
    return Status::invalid(rec.label + ": reserve_states: beam width " +
                           std::to_string(rec.beam_width) + " (states inside a step need 1)");
  }
  uint64_t after = rec.history;
  for (uint64_t p : points) {
    const std::string what = rec.label + ": reserve_states: point " + std::to_string(p);
    if (p <= after) {
      return Status::invalid(what + " is not past " + std::to_string(after) +
                             " (points are past history and increasing)");
    }
    if (p > rec.capacity)
      return Status::invalid(what + " is past capacity " + std::to_string(rec.capacity));
    if (p % tpb != 0) {
      return Status::invalid(what + " is not a multiple of tokens_per_block " +
                             std::to_string(tpb));
    }
    after = p;
  }
  return Status::ok();
}

Result<std::vector<uint64_t>> ManagerCore::reserve_states(uint32_t id,
                                                          std::span<const uint64_t> points,
                                                          SnapshotRole role) {
  std::unique_lock lock(mu_);
  if (Status s = expect_state(id, CacheState::kActive, "reserve_states"); !s) return s;
  CacheRecord& rec = caches_[id];
  if (Status s = check_reserve(rec, points); !s) return s;
  auto reserved_group = [&](const CacheGroup& g) {
    return publishable(g) && g.kind == GroupKind::kSsm;
  };
  std::vector<uint64_t> one(plan_.pool_groups().size(), 0);
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (reserved_group(g)) one[g.pool_group.value] += 1;
  }
  if (role == SnapshotRole::kKept) {  // all or nothing (the earlier reservations still count)
    std::vector<uint64_t> need(one.size());
    for (size_t pg = 0; pg < need.size(); ++pg) need[pg] = one[pg] * points.size();
    if (Status s = check_room("reserve_states", need); !s)
      return Status(s.code(), rec.label + ": " + s.message());
  }
  release_reserved(rec, UINT64_MAX);
  for (uint64_t p : points) {
    // Speculative: as many as cost no page of value.
    if (role == SnapshotRole::kSpeculative &&
        (!check_room("reserve_states", one).is_ok() || !room_without_loss(one)))
      break;
    make_room(one);
    for (const CacheGroup& g : plan_.cache_groups()) {
      if (reserved_group(g)) rec.groups[g.id.value].reserved.push_back(fresh_page(rec, g.id, 0));
    }
    rec.reserved_points.push_back(p);
  }
  rec.note_ready(storage_.flush());  // the evictions that made room run before the kernel writes
  after_mutation();
  return rec.reserved_points;
}

Result<std::vector<int32_t>> ManagerCore::reserved_state_slots(uint32_t id,
                                                               CacheGroupId group) const {
  std::shared_lock lock(mu_);
  if (Status s = expect_state(id, CacheState::kActive, "reserved_state_slots"); !s) return s;
  if (group.value >= plan_.cache_groups().size() ||
      plan_.cache_group(group).kind != GroupKind::kSsm) {
    return Status::invalid("reserved_state_slots: cache group " + std::to_string(group.value) +
                           " is not an SSM group");
  }
  std::vector<int32_t> slots;
  for (PageId pid : caches_[id].groups[group.value].reserved) {
    slots.push_back(pid == storage::kNoPage ? kBadPageIndex
                                            : static_cast<int32_t>(storage_.page(pid).slot.value));
  }
  return slots;
}

std::optional<size_t> ManagerCore::reserved_at(const CacheRecord& rec, uint64_t point) {
  auto it = std::lower_bound(rec.reserved_points.begin(), rec.reserved_points.end(), point);
  if (it == rec.reserved_points.end() || *it != point) return std::nullopt;
  return static_cast<size_t>(it - rec.reserved_points.begin());
}

void ManagerCore::release_reserved(CacheRecord& rec, uint64_t upto) {
  size_t n = 0;
  while (n < rec.reserved_points.size() && rec.reserved_points[n] <= upto) ++n;
  if (n == 0) return;
  for (GroupState& gs : rec.groups) {
    if (gs.reserved.empty()) continue;
    for (size_t i = 0; i < n; ++i) {
      if (gs.reserved[i] != storage::kNoPage) storage_.drop_ref(gs.reserved[i], Ref::kActive);
    }
    gs.reserved.erase(gs.reserved.begin(), gs.reserved.begin() + static_cast<int64_t>(n));
  }
  rec.reserved_points.erase(rec.reserved_points.begin(),
                            rec.reserved_points.begin() + static_cast<int64_t>(n));
}

}  // namespace hybridkv::cache_detail
