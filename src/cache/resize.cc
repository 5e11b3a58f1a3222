// resize: capacity grows or shrinks, history advances, window blocks that no step reads any
// more are released. O(blocks added or released + groups): a decode step touches no old block.
#include <algorithm>

#include "cache/manager_core.h"
#include "util/blocks.h"
#include "util/check.h"

namespace hybridkv::cache_detail {

using storage::Ref;

Status ManagerCore::check_index_buffers(uint32_t id, uint64_t capacity) const {
  const CacheRecord& rec = caches_[id];
  const uint64_t blocks = blocks_for(capacity, plan_.config().tokens_per_block);
  for (const CacheGroup& g : plan_.cache_groups()) {
    const GroupState& gs = rec.groups[g.id.value];
    for (uint32_t k = 0; k < rec.beam_width; ++k) {
      const uint64_t room = gs.index_buffers[k].size();
      const uint64_t want = g.kind == GroupKind::kSsm ? 1 : blocks;
      if (room != 0 && room < want) {
        return Status::invalid(label(id) + ": resize: the index buffer of group " +
                               std::to_string(g.id.value) + " beam " + std::to_string(k) +
                               " holds " + std::to_string(room) + " entries; capacity " +
                               std::to_string(capacity) + " needs " + std::to_string(want));
      }
    }
  }
  return Status::ok();
}

Status ManagerCore::resize(uint32_t id, uint64_t capacity, uint64_t history) {
  std::unique_lock lock(mu_);
  if (Status s = expect_state(id, CacheState::kActive, "resize"); !s) return s;
  CacheRecord& rec = caches_[id];
  if (history > capacity) {
    return Status::invalid(label(id) + ": resize: history " + std::to_string(history) +
                           " must be <= capacity " + std::to_string(capacity));
  }
  if (history < rec.history) {
    return Status::invalid(label(id) + ": resize: history " + std::to_string(history) +
                           " is below the current history " + std::to_string(rec.history) +
                           " (history only grows)");
  }
  if (Status s = check_index_buffers(id, capacity); !s) return s;
  if (Status s = check_scratch_history(id, history); !s) return s;
  // Blocks below `have` already hold every page they will ever need (released blocks are never
  // needed again: history only grows), so a resize looks only at what changes.
  const uint64_t have = rec.attention_blocks;
  const std::vector<BlockRange> scratch = scratch_plan(rec, capacity, history, have);
  std::vector<uint64_t> need = new_pages_needed(rec, capacity, history, have, scratch);
  add_scratch_needs(rec, scratch, need);
  if (Status s = check_room("resize", need); !s)
    return Status(s.code(), label(id) + ": " + s.message());
  make_room(need);
  allocate_pages(rec, capacity, history, have, scratch);
  set_scratch(rec, scratch);
  const bool any_scratch =
      std::any_of(scratch.begin(), scratch.end(), [](const BlockRange& r) { return r.size() > 0; });
  const uint64_t rewind = static_cast<uint64_t>(plan_.config().max_rewind_len);
  rec.scratch_boundary = !any_scratch ? 0 : (capacity > rewind ? capacity - rewind : 0);
  release_stale_and_cut(rec, capacity, history);
  rec.note_ready(storage_.flush());
  rec.capacity = capacity;
  rec.history = history;
  after_mutation();
  return Status::ok();
}

void ManagerCore::release_block(CacheRecord& rec, CacheGroupId group, uint64_t block) {
  PageId* row = rec.row(group, block);
  for (uint32_t k = 0; k < rec.beams_at(block); ++k) {
    if (row[k] != kNoPage) storage_.drop_ref(row[k], Ref::kActive);
  }
  std::fill(row, row + rec.beam_width, kNoPage);
}

// Without commit_min_snapshot a page that leaves the window waits (HELD) for the commit that
// publishes it, so sliding-window prefixes are reusable; with it, commits at snapshot points
// publish the window pages they need, and pages leaving the window are freed at once.
bool ManagerCore::holds_until_commit(const CacheRecord& rec, const CacheGroup& g,
                                     uint64_t block) const {
  const ManagerConfig& cfg = plan_.config();
  return cfg.enable_block_reuse && !cfg.commit_min_snapshot && rec.committing &&
         g.policy != ReusePolicy::kPrivate && (block + 1) * cfg.tokens_per_block > rec.committed;
}

// Moves beam 0's page of `block` to the held list (its row entry is cleared by release_block).
void ManagerCore::hold_stale_block(CacheRecord& rec, const CacheGroup& g, uint64_t block) {
  GroupState& gs = rec.groups[g.id.value];
  PageId* row = rec.row(g.id, block);
  const PageId page = row[0];
  if (gs.held.empty()) gs.held_begin = block;
  HKV_CHECK(gs.held_begin + gs.held.size() == block, "held window blocks must be contiguous");
  gs.held.push_back(page);
  if (page == kNoPage) return;
  storage_.convert_ref(page, Ref::kActive, Ref::kSuspended);
  std::fill(row, row + rec.entries_of_beam0(block), kNoPage);
}

void ManagerCore::release_held(CacheRecord& rec, uint64_t end_block) {
  for (GroupState& gs : rec.groups) {
    while (!gs.held.empty() && gs.held_begin < end_block) {
      if (gs.held.front() != kNoPage) storage_.drop_ref(gs.held.front(), Ref::kSuspended);
      gs.held.pop_front();
      ++gs.held_begin;
    }
  }
}

void ManagerCore::release_stale_and_cut(CacheRecord& rec, uint64_t capacity, uint64_t history) {
  const uint32_t tpb = plan_.config().tokens_per_block;
  const uint64_t blocks = blocks_for(capacity, tpb);
  const uint64_t have = rec.attention_blocks;
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kSsm) continue;
    GroupState& gs = rec.groups[g.id.value];
    // Window blocks that no step reads any more.
    if (g.window) {
      const uint64_t stale_end = std::min(g.first_live_block(history, tpb), have);
      for (uint64_t b = std::max<uint64_t>(gs.stale_from, g.sink_blocks); b < stale_end; ++b) {
        if (holds_until_commit(rec, g, b)) hold_stale_block(rec, g, b);
        release_block(rec, g.id, b);
        set_table_entries(rec, g, b, b + 1);
      }
      gs.stale_from = std::max(gs.stale_from, stale_end);
    }
    // Blocks past a smaller capacity.
    for (uint64_t b = blocks; b < have; ++b) release_block(rec, g.id, b);
    gs.pages.resize(blocks * rec.beam_width, kNoPage);
    for (uint32_t k = 0; k < rec.beam_width; ++k) gs.tables[k].resize(blocks, kBadPageIndex);
    if (blocks > have) set_table_entries(rec, g, have, blocks);
  }
  rec.attention_blocks = blocks;
}

}  // namespace hybridkv::cache_detail
