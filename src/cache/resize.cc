// resize: capacity grows or shrinks, history advances, window blocks that no step reads any
// more are released. O(blocks added or released + groups): a decode step touches no old block.
#include <algorithm>
#include <unordered_map>

#include "cache/manager_core.h"
#include "util/blocks.h"
#include "util/check.h"

namespace hybridkv::cache_detail {

using storage::Ref;

Status ManagerCore::check_index_buffers(uint32_t id, uint64_t capacity) const {
  const CacheRecord& rec = caches_[id];
  const uint64_t blocks = blocks_for(capacity, plan_.config().tokens_per_block);
  if (blocks <= rec.index_buffer_room) return Status::ok();
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

// The longest sequence a cache indexes: positions and slot indices reach kernels as int32.
constexpr uint64_t kMaxCapacity = (1ull << 31) - 1;

// A capacity no GPU could hold is refused before anything is counted: every block of a full
// attention group is on the GPU while the cache is ACTIVE, so its pool group's reserved slots
// (the most set_quota or rebalancing can ever give it) bound the blocks.
Status ManagerCore::check_capacity(uint32_t id, uint64_t capacity) const {
  if (capacity > kMaxCapacity) {
    return Status::invalid(label(id) + ": resize: capacity " + std::to_string(capacity) +
                           " is beyond the longest sequence a cache indexes (" +
                           std::to_string(kMaxCapacity) + " tokens, int32 positions)");
  }
  const uint64_t blocks = blocks_for(capacity, plan_.config().tokens_per_block);
  if (blocks <= caches_[id].attention_blocks) return Status::ok();  // no block added
  const TierPlan& gpu = plan_.tiers().front();
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kSsm || g.window) continue;
    const uint64_t most = gpu.reserved_slots[g.pool_group.value];
    if (blocks > most) {
      return Status(StatusCode::kOutOfPages,
                    label(id) + ": resize: capacity " + std::to_string(capacity) + " needs " +
                        std::to_string(blocks) + " blocks of cache group " +
                        std::to_string(g.id.value) + "; its GPU pool group " +
                        std::to_string(g.pool_group.value) + " holds at most " +
                        std::to_string(most) + " slots");
    }
  }
  return Status::ok();
}

Status ManagerCore::plan_resize(uint32_t id, uint64_t capacity, uint64_t history,
                                ResizePlan& out) const {
  if (Status s = expect_state(id, CacheState::kActive, "resize"); !s) return s;
  const CacheRecord& rec = caches_[id];
  if (history > capacity) {
    return Status::invalid(label(id) + ": resize: history " + std::to_string(history) +
                           " must be <= capacity " + std::to_string(capacity));
  }
  if (history < rec.history) {
    return Status::invalid(label(id) + ": resize: history " + std::to_string(history) +
                           " is below the current history " + std::to_string(rec.history) +
                           " (history only grows)");
  }
  if (Status s = check_capacity(id, capacity); !s) return s;
  if (Status s = check_index_buffers(id, capacity); !s) return s;
  if (Status s = check_scratch_history(id, history); !s) return s;
  // Blocks below `have` already hold every page they will ever need (released blocks are never
  // needed again: history only grows), so a resize looks only at what changes.
  out.id = id;
  out.capacity = capacity;
  out.history = history;
  out.have = rec.attention_blocks;
  out.in_place = changes_no_page(rec, capacity);
  if (out.in_place) {  // most decode steps: nothing below can find a page to change
    out.scratch.clear();
    out.need.assign(plan_.pool_groups().size(), 0);
    return Status::ok();
  }
  scratch_plan(rec, capacity, history, out.have, out.scratch);
  new_pages_needed(rec, capacity, history, out.have, out.scratch, out.need);
  add_scratch_needs(rec, out.scratch, out.need);
  return Status::ok();
}

bool ManagerCore::changes_no_page(const CacheRecord& rec, uint64_t capacity) const {
  if (blocks_for(capacity, plan_.config().tokens_per_block) != rec.attention_blocks) return false;
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.window) return false;
    const std::vector<PageId>& pages = rec.groups[g.id.value].pages;
    if (g.kind == GroupKind::kSsm && std::find(pages.begin(), pages.end(), kNoPage) != pages.end())
      return false;
  }
  return true;
}

void ManagerCore::apply_resize(const ResizePlan& p) {
  CacheRecord& rec = caches_[p.id];
  if (p.in_place) {
    rec.note_ready(storage_.flush());
    rec.capacity = p.capacity;
    rec.history = p.history;
    return;
  }
  make_room(p.need);
  allocate_pages(rec, p.capacity, p.history, p.have, p.scratch);
  set_scratch(rec, p.scratch);
  const bool any_scratch = std::any_of(p.scratch.begin(), p.scratch.end(),
                                       [](const BlockRange& r) { return r.size() > 0; });
  const uint64_t rewind = static_cast<uint64_t>(plan_.config().max_rewind_len);
  rec.scratch_boundary = !any_scratch ? 0 : (p.capacity > rewind ? p.capacity - rewind : 0);
  release_stale_and_cut(rec, p.capacity, p.history);
  rec.note_ready(storage_.flush());
  rec.capacity = p.capacity;
  rec.history = p.history;
}

Status ManagerCore::resize(uint32_t id, uint64_t capacity, uint64_t history) {
  std::unique_lock lock(mu_);
  ResizePlan& p = resize_plan_;
  if (Status s = plan_resize(id, capacity, history, p); !s) return s;
  if (Status s = check_room("resize", p.need); !s)
    return Status(s.code(), label(id) + ": " + s.message());
  apply_resize(p);
  after_mutation();
  return Status::ok();
}

// Every cache is checked and the room for all of them counted before any changes: pages one
// resize allocates are LOCKED, never room for another, so the sum of the needs is what must fit.
Status ManagerCore::resize_all(std::span<const ResizeCall> calls) {
  std::unique_lock lock(mu_);
  std::vector<ResizePlan> plans(calls.size());
  std::vector<uint64_t> total(plan_.pool_groups().size(), 0);
  std::unordered_map<uint32_t, size_t> seen;
  for (size_t i = 0; i < calls.size(); ++i) {
    const uint32_t id = calls[i].id;
    if (auto [it, fresh] = seen.emplace(id, i); !fresh) {
      return Status::invalid(label(id) + ": resize_all: appears at positions " +
                             std::to_string(it->second) + " and " + std::to_string(i));
    }
    if (Status s = plan_resize(id, calls[i].capacity, calls[i].history, plans[i]); !s) return s;
    for (size_t pg = 0; pg < total.size(); ++pg) total[pg] += plans[i].need[pg];
  }
  if (Status s = check_room("resize_all", total); !s) {
    return Status(s.code(), s.message() + " (the " + std::to_string(calls.size()) +
                                " caches together; nothing changed)");
  }
  for (const ResizePlan& p : plans) apply_resize(p);
  after_mutation();
  return Status::ok();
}

void ManagerCore::release_block(CacheRecord& rec, CacheGroupId group, uint64_t block,
                                RefChanges& changes) {
  PageId* row = rec.row(group, block);
  for (uint32_t k = 0; k < rec.beams_at(block); ++k) {
    if (row[k] != kNoPage) changes.push_back({row[k], Ref::kActive, std::nullopt});
  }
  std::fill(row, row + rec.beam_width, kNoPage);
}

// A page that leaves the window waits (HELD) for the commit that publishes it, so that a
// sliding-window prefix stays reusable at every committed block end. With commit_min_snapshot
// each commit publishes the window pages its own endpoint needs, and the rest go at once where
// matches can end only at those endpoints (a REQUIRED SSM group: only at snapshots). Without
// one, every block end is an endpoint: a shared system prompt needs its own window pages, so
// the pages of the tokens the cache was given (its prompt) wait for their commit too; pages of
// generated tokens do not, so a long decode does not pile up pages until its answer's commit.
bool ManagerCore::holds_until_commit(const CacheRecord& rec, const CacheGroup& g,
                                     uint64_t block) const {
  const ManagerConfig& cfg = plan_.config();
  const uint64_t end = (block + 1) * cfg.tokens_per_block;
  if (!cfg.enable_block_reuse || !rec.committing || g.policy == ReusePolicy::kPrivate ||
      end <= rec.committed) {
    return false;
  }
  if (!cfg.commit_min_snapshot) return true;
  const auto& groups = plan_.cache_groups();
  const bool snapshots_only = std::any_of(groups.begin(), groups.end(), [](const CacheGroup& c) {
    return c.kind == GroupKind::kSsm && c.policy == ReusePolicy::kRequired;
  });
  return !snapshots_only && end <= rec.tokens.size();
}

// Moves beam 0's page of `block` to the held list (its row entry is cleared by release_block).
void ManagerCore::hold_stale_block(CacheRecord& rec, const CacheGroup& g, uint64_t block,
                                   RefChanges& changes) {
  GroupState& gs = rec.groups[g.id.value];
  PageId* row = rec.row(g.id, block);
  const PageId page = row[0];
  if (gs.held.empty()) gs.held_begin = block;
  HKV_CHECK(gs.held_begin + gs.held.size() == block, "held window blocks must be contiguous");
  gs.held.push_back(page);
  if (page == kNoPage) return;
  changes.push_back({page, Ref::kActive, Ref::kSuspended});
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
  RefChanges changes;  // the references given up, applied in one storage call at the end
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kSsm) continue;
    GroupState& gs = rec.groups[g.id.value];
    // Window blocks that no step reads any more.
    if (g.window) {
      const uint64_t stale_end = std::min(g.first_live_block(history, tpb), have);
      for (uint64_t b = std::max<uint64_t>(gs.stale_from, g.sink_blocks); b < stale_end; ++b) {
        if (holds_until_commit(rec, g, b)) hold_stale_block(rec, g, b, changes);
        release_block(rec, g.id, b, changes);
        set_table_entries(rec, g, b, b + 1);
      }
      gs.stale_from = std::max(gs.stale_from, stale_end);
    }
    // Blocks past a smaller capacity.
    for (uint64_t b = blocks; b < have; ++b) release_block(rec, g.id, b, changes);
    gs.pages.resize(blocks * rec.beam_width, kNoPage);
    for (uint32_t k = 0; k < rec.beam_width; ++k) gs.tables[k].resize(blocks, kBadPageIndex);
    if (blocks > have) set_table_entries(rec, g, have, blocks);
  }
  rec.attention_blocks = blocks;
  storage_.change_refs(changes);
}

}  // namespace hybridkv::cache_detail
