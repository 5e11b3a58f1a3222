// SWA scratch (issue 11 item 3; seeds 002 and 004): during a long prefill, window blocks that
// go stale within the same step get no persistent page. They map onto a few scratch slots per
// cache and window group, shared by every layer of the group (a layer's kernel is done with
// them before the next layer writes), released after the commit that ends their use (or at the
// next resize, suspend or close) and never committed to the tree.
#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

using storage::kGpuTier;
using storage::Ref;

// Per cache group: the scratch blocks of a resize to (capacity, history); only blocks from
// `have` on (blocks the cache already holds keep their pages).
void ManagerCore::scratch_plan(const CacheRecord& rec, uint64_t capacity, uint64_t history,
                               uint64_t have, std::vector<BlockRange>& out) const {
  out.assign(plan_.cache_groups().size(), BlockRange{});
  if (!rec.scratch_on) return;
  const ManagerConfig& cfg = plan_.config();
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind != GroupKind::kAttention || !g.window) continue;
    auto [begin, end] = g.scratch_blocks(
        capacity, history, static_cast<uint64_t>(cfg.max_rewind_len), cfg.tokens_per_block);
    begin = std::max(begin, have);
    if (begin < end) out[g.id.value] = {begin, end};
  }
}

// Scratch pages a resize allocates beyond those the cache has, per GPU pool group.
void ManagerCore::add_scratch_needs(const CacheRecord& rec, const std::vector<BlockRange>& plan,
                                    std::vector<uint64_t>& need) const {
  for (const CacheGroup& g : plan_.cache_groups()) {
    const uint64_t want = g.scratch_slots(plan[g.id.value].size());
    const uint64_t own = rec.groups[g.id.value].scratch.size();
    if (want > own) need[g.pool_group.value] += want - own;
  }
}

// Makes the cache's scratch pages match `plan` (room already made): keeps what it has, frees
// extras, allocates the rest (a fresh page waits for its slot's previous user).
void ManagerCore::set_scratch(CacheRecord& rec, const std::vector<BlockRange>& plan) {
  for (const CacheGroup& g : plan_.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    const uint64_t want = g.scratch_slots(plan[g.id.value].size());
    while (gs.scratch.size() > want) {
      storage_.drop_ref(gs.scratch.back(), Ref::kActive);
      gs.scratch.pop_back();
    }
    while (gs.scratch.size() < want) gs.scratch.push_back(fresh_page(rec, g.id, 0));
    gs.scratch_blocks = want == 0 ? BlockRange{} : plan[g.id.value];
  }
}

void ManagerCore::release_scratch(CacheRecord& rec) {
  for (GroupState& gs : rec.groups) {
    for (PageId pid : gs.scratch) storage_.drop_ref(pid, Ref::kActive);
    gs.scratch.clear();
    gs.scratch_blocks = BlockRange{};
  }
  rec.scratch_boundary = 0;
}

// While scratch blocks of the last step exist, the next step must start at or after the point
// the scratch range was computed for (capacity - max_rewind_len): a deeper rewind would need KV
// that lived only in scratch.
Status ManagerCore::check_scratch_history(uint32_t id, uint64_t history) const {
  const CacheRecord& rec = caches_[id];
  if (rec.scratch_boundary == 0 || history >= rec.scratch_boundary) return Status::ok();
  return Status(StatusCode::kFailedPrecondition,
                label(id) + ": resize: history " + std::to_string(history) + " rewinds past " +
                    std::to_string(rec.scratch_boundary) +
                    ", the end of the last step less max_rewind_len " +
                    std::to_string(plan_.config().max_rewind_len) +
                    ": the blocks before it were SWA scratch");
}

Status ManagerCore::set_swa_scratch(uint32_t id, bool on) {
  std::unique_lock lock(mu_);
  CacheRecord& rec = caches_[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": set_swa_scratch on a CLOSED cache");
  }
  if (on && !plan_.config().swa_scratch_reuse) {
    return Status::invalid(label(id) +
                           ": swa scratch needs ManagerConfig::swa_scratch_reuse (the plan "
                           "reserves the scratch slots)");
  }
  rec.scratch_on = on;  // from the next resize on
  return Status::ok();
}

Result<ScratchDesc> ManagerCore::scratch(uint32_t id, CacheGroupId group) const {
  std::shared_lock lock(mu_);
  if (Status s = check_group(id, group, 0); !s) return s;
  const CacheRecord& rec = caches_[id];
  ScratchDesc d;
  const GroupState& gs = rec.groups[group.value];
  if (!rec.active() || gs.scratch.empty()) return d;
  d.first_block = gs.scratch_blocks.begin;
  d.num_blocks = gs.scratch_blocks.size();
  for (PageId pid : gs.scratch)
    d.slots.push_back(static_cast<int32_t>(storage_.page(pid).slot.value));
  return d;
}

}  // namespace hybridkv::cache_detail
