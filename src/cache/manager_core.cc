#include "cache/manager_core.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "plan/plan_internal.h"
#include "util/check.h"

namespace hybridkv::cache_detail {

namespace {
constexpr size_t kGpu = 0;  // the GPU tier is always the first

uint64_t blocks_for(uint64_t tokens, uint32_t tpb) { return (tokens + tpb - 1) / tpb; }
}  // namespace

ManagerCore::ManagerCore(StoragePlan p, std::unique_ptr<memory::MemoryBackend> b)
    : plan(std::move(p)),
      backend(std::move(b)),
      storage(plan, backend.get()),
      tree(plan.cache_groups().size()),
      hasher(plan.config().block_hash) {
  storage.on_drop = [this](PageId page) { on_page_dropped(page); };
  storage.on_move = [this](PageId page) { on_page_moved(page); };
  reuse_stats.groups.resize(plan.cache_groups().size());
}

std::string ManagerCore::label(uint32_t id) const { return "cache " + std::to_string(id); }

Status ManagerCore::expect_state(uint32_t id, CacheState want, const char* op) const {
  const CacheRecord& rec = caches[id];
  if (rec.state == want) return Status::ok();
  return Status(StatusCode::kFailedPrecondition, label(id) + ": " + op + " needs a " +
                                                     cache_state_name(want) + " cache, it is " +
                                                     cache_state_name(rec.state));
}

Status ManagerCore::check_group(uint32_t id, CacheGroupId group, uint32_t beam) const {
  if (group.value >= plan.cache_groups().size()) {
    return Status::not_found(label(id) + ": unknown cache group " + std::to_string(group.value) +
                             " (the plan has " + std::to_string(plan.cache_groups().size()) + ")");
  }
  if (beam >= caches[id].beam_width) {
    return Status::invalid(label(id) + ": beam " + std::to_string(beam) + " >= beam width " +
                           std::to_string(caches[id].beam_width));
  }
  return Status::ok();
}

template <typename Fn>
void ManagerCore::for_each_page(const CacheRecord& rec, Fn&& fn) const {
  for (const CacheGroup& g : plan.cache_groups()) {
    const GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) {
      for (PageId id : gs.pages) {
        if (id != kNoPage) fn(id, g, uint64_t{0});
      }
      continue;
    }
    const uint64_t blocks = gs.pages.size() / rec.beam_width;
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint32_t beams = b < rec.shared_blocks ? 1 : rec.beam_width;
      for (uint32_t k = 0; k < beams; ++k) {
        const PageId id = gs.pages[b * rec.beam_width + k];
        if (id != kNoPage) fn(id, g, b);
      }
    }
  }
}

bool ManagerCore::block_needed(const CacheGroup& group, uint64_t block, uint64_t capacity,
                               uint64_t history) const {
  const uint32_t tpb = plan.config().tokens_per_block;
  if (block >= blocks_for(capacity, tpb)) return false;
  if (!group.window) return true;
  // A step computing tokens from `history` on reads back `window` tokens (DESIGN §3.4).
  const uint64_t live_begin = (history > *group.window ? history - *group.window : 0) / tpb;
  return block >= live_begin || block < group.sink_blocks;
}

std::vector<uint64_t> ManagerCore::new_pages_needed(const CacheRecord& rec, uint64_t capacity,
                                                    uint64_t history, uint64_t from_block) const {
  std::vector<uint64_t> need(plan.pool_groups().size(), 0);
  for (const CacheGroup& g : plan.cache_groups()) {
    const GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) {
      for (PageId id : gs.pages) need[g.pool_group.value] += id == kNoPage ? 1 : 0;
      continue;
    }
    const uint64_t blocks = blocks_for(capacity, plan.config().tokens_per_block);
    const uint64_t have = gs.pages.size() / rec.beam_width;
    for (uint64_t b = from_block; b < blocks; ++b) {
      if (!block_needed(g, b, capacity, history)) continue;
      const uint32_t beams = b < rec.shared_blocks ? 1 : rec.beam_width;
      for (uint32_t k = 0; k < beams; ++k) {
        if (b >= have || gs.pages[b * rec.beam_width + k] == kNoPage) ++need[g.pool_group.value];
      }
    }
  }
  return need;
}

int32_t ManagerCore::priority_of(const CacheRecord& rec, uint64_t block) const {
  return block < rec.block_priority.size() ? rec.block_priority[block] : storage::kDefaultPriority;
}

void ManagerCore::allocate_pages(CacheRecord& rec, uint64_t capacity, uint64_t history,
                                 uint64_t from_block) {
  auto fresh = [&](CacheGroupId group, int32_t priority) {
    const PageId id = storage.allocate(group, kGpu);
    storage::Page& p = storage.page(id);
    p.active_refs = 1;
    p.priority = priority;
    storage.refresh(id);
    if (p.ready.ticket > rec.ready.ticket) rec.ready = p.ready;
    return id;
  };
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) {
      for (PageId& id : gs.pages) {
        if (id == kNoPage) id = fresh(g.id, storage::kDefaultPriority);
      }
      continue;
    }
    const uint64_t blocks = blocks_for(capacity, plan.config().tokens_per_block);
    if (gs.pages.size() < blocks * rec.beam_width)
      gs.pages.resize(blocks * rec.beam_width, kNoPage);
    for (uint64_t b = from_block; b < blocks; ++b) {
      if (!block_needed(g, b, capacity, history)) continue;
      PageId* row = &gs.pages[b * rec.beam_width];
      if (b < rec.shared_blocks) {
        if (row[0] == kNoPage)
          std::fill(row, row + rec.beam_width, fresh(g.id, priority_of(rec, b)));
      } else {
        for (uint32_t k = 0; k < rec.beam_width; ++k) {
          if (row[k] == kNoPage) row[k] = fresh(g.id, priority_of(rec, b));
        }
      }
    }
  }
}

Status ManagerCore::check_room(const char* op, const std::vector<uint64_t>& need,
                               const storage::Exclusions& excluded) const {
  for (const PoolGroup& pg : plan.pool_groups()) {
    const uint64_t n = need[pg.id.value];
    if (n == 0) continue;
    const uint64_t room = storage.max_room(kGpu, pg.id, excluded);
    if (room < n) {
      return Status(StatusCode::kOutOfPages,
                    std::string(op) + ": pool group " + std::to_string(pg.id.value) +
                        " (GPU) needs " + std::to_string(n) + " more slots; " +
                        std::to_string(room) + " of " +
                        std::to_string(storage.total_slots(kGpu, pg.id)) + " can be made free");
    }
  }
  return Status::ok();
}

void ManagerCore::rebuild_tables(CacheRecord& rec) {
  const bool active = rec.state == CacheState::kActive;
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) continue;
    const uint64_t blocks = blocks_for(rec.capacity, plan.config().tokens_per_block);
    for (uint32_t k = 0; k < rec.beam_width; ++k) {
      std::vector<int32_t>& table = gs.tables[k];
      table.assign(blocks, kBadPageIndex);
      if (!active) continue;
      for (uint64_t b = 0; b < blocks && b * rec.beam_width + k < gs.pages.size(); ++b) {
        const PageId id = gs.pages[b * rec.beam_width + k];
        if (id != kNoPage) table[b] = static_cast<int32_t>(storage.page(id).slot);
      }
    }
  }
  write_index_buffers(rec);
}

void ManagerCore::write_index_buffers(CacheRecord& rec) {
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    for (uint32_t k = 0; k < rec.beam_width; ++k) {
      std::span<int32_t> buffer = gs.index_buffers[k];
      if (buffer.empty()) continue;
      std::fill(buffer.begin(), buffer.end(), kBadPageIndex);
      if (rec.state != CacheState::kActive) continue;
      if (g.kind == GroupKind::kSsm) {
        if (gs.pages[k] != kNoPage)
          buffer[0] = static_cast<int32_t>(storage.page(gs.pages[k]).slot);
      } else {
        std::copy(gs.tables[k].begin(), gs.tables[k].end(), buffer.begin());
      }
    }
  }
}

Result<uint32_t> ManagerCore::create(const CacheOptions& options) {
  const ManagerConfig& config = plan.config();
  if (shut_down) return Status(StatusCode::kFailedPrecondition, "the manager is shut down");
  if (options.beam_width == 0) return Status::invalid("beam_width 0 must be > 0");
  if (config.max_live_kv_caches && live_caches >= *config.max_live_kv_caches) {
    return Status(StatusCode::kRefused, "max_live_kv_caches " +
                                            std::to_string(*config.max_live_kv_caches) +
                                            " living caches already exist");
  }
  if (options.beam_width > 1) {
    for (const PoolGroup& pg : plan.pool_groups()) {
      if (pg.fixed_private) {
        return Status(StatusCode::kRefused,
                      "beam_width " + std::to_string(options.beam_width) +
                          " needs one PRIVATE state per beam; the fixed PRIVATE pool (pool group " +
                          std::to_string(pg.id.value) + ", max_live_kv_caches) has one per cache");
      }
    }
  }
  uint32_t id;
  if (!free_ids.empty()) {
    id = free_ids.back();
    free_ids.pop_back();
  } else {
    id = static_cast<uint32_t>(caches.size());
    caches.emplace_back();
  }
  CacheRecord& rec = caches[id];
  rec = CacheRecord{};
  rec.in_use = true;
  rec.state = CacheState::kSuspended;
  rec.beam_width = options.beam_width;
  rec.scope = options.scope;
  rec.tokens = options.input_tokens;
  rec.shared_blocks =
      options.beam_width > 1 ? options.input_tokens.size() / config.tokens_per_block : 0;
  rec.groups.resize(plan.cache_groups().size());
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) gs.pages.assign(rec.beam_width, kNoPage);
    gs.tables.resize(rec.beam_width);
    gs.index_buffers.resize(rec.beam_width);
  }
  rec.multimodal = options.multimodal;
  MatchPlan mp = match(hasher, rec.scope, rec.tokens, rec.multimodal);
  // Attention could reuse more than the snapshots allowed: mark the block end where a snapshot
  // would have helped, so that requests passing it (this one first) take one there.
  const uint32_t tpb = plan.config().tokens_per_block;
  const uint64_t wanted = mp.match.hybrid_tokens / tpb;
  if (mp.match.hybrid_tokens > mp.match.reused_tokens && wanted > 0 &&
      wanted * tpb > mp.match.reused_tokens && wanted <= mp.path.size()) {
    prefix::Node& n = tree.node(mp.path[wanted - 1]);
    if (!n.demanded) {
      n.demanded = true;
      mp.match.demand_points.push_back(wanted * tpb);
      std::sort(mp.match.demand_points.begin(), mp.match.demand_points.end());
    }
  }
  attach_match(rec, mp);
  ++live_caches;
  return id;
}

Status ManagerCore::resume(uint32_t id, const std::vector<CacheGroupId>* optional_groups) {
  if (Status s = expect_state(id, CacheState::kSuspended, "resume"); !s) return s;
  CacheRecord& rec = caches[id];
  const bool first = !rec.first_resume_done;
  if (first) {
    // The OPTIONAL choice is made (and checked) once; it persists across suspend/resume.
    if (Status s = prepare_first_resume(id, optional_groups); !s) return s;
  }
  // What the resume needs per pool group: fresh pages, held pages to bring to the GPU, and on
  // the first resume private copies of the matched tail block and snapshots.
  std::vector<uint64_t> need = new_pages_needed(rec, rec.capacity, rec.history, 0);
  std::vector<uint64_t> gpu_own_queued(plan.pool_groups().size(), 0);
  storage::Exclusions excluded = storage.empty_exclusions();
  for_each_page(rec, [&](PageId pid, const CacheGroup& g, uint64_t block) {
    const storage::Page& p = storage.page(pid);
    const GroupState& gs = rec.groups[g.id.value];
    const bool dropped_now = first && !gs.selected;
    // A tree page the first resume copies from is released right after the copy: it needs the
    // GPU for a moment, but the gate counts what stays locked.
    const bool copy_source = first && gs.selected && gs.copy_pending &&
                             (g.kind == GroupKind::kSsm || block + 1 == rec.attention_blocks);
    if (dropped_now)
      ++need[p.pool_group.value];  // replaced by a fresh page
    else if (p.tier != TierKind::kGpu)
      ++need[p.pool_group.value];
    if (p.queue != storage::QueueKind::kNone) {
      for (size_t t = 0; t < storage.num_tiers(); ++t) {
        if (storage.tier_kind(t) == p.tier) ++excluded[t][p.pool_group.value];
      }
      if (p.tier == TierKind::kGpu && !copy_source) ++gpu_own_queued[p.pool_group.value];
    }
  });
  if (first) {
    for (const CacheGroup& g : plan.cache_groups()) {
      const GroupState& gs = rec.groups[g.id.value];
      if (!gs.copy_pending || !gs.selected) continue;
      const bool shared_tail = g.kind == GroupKind::kAttention && rec.attention_blocks > 0 &&
                               rec.attention_blocks - 1 < rec.shared_blocks;
      need[g.pool_group.value] += shared_tail ? 1 : rec.beam_width;
    }
  }
  // The utilization gate: what would be locked after the resume, per GPU pool group.
  const double util = plan.config().max_util_for_resume;
  for (const PoolGroup& pg : plan.pool_groups()) {
    const uint64_t total = storage.total_slots(kGpu, pg.id);
    const uint64_t locked =
        total - storage.free_slots(kGpu, pg.id) - storage.evictable_slots(kGpu, pg.id);
    const uint64_t after = locked + need[pg.id.value] + gpu_own_queued[pg.id.value];
    const uint64_t usable = plan_detail::usable_slots(total, util);
    if (after > usable) {
      ++storage.stats.refused_resumes;
      return Status(StatusCode::kRefused,
                    label(id) + ": resume refused: pool group " + std::to_string(pg.id.value) +
                        " (GPU) would have " + std::to_string(after) + " of " +
                        std::to_string(total) + " slots locked, above max_util_for_resume " +
                        std::to_string(util) + " (" + std::to_string(usable) + " slots)");
    }
  }
  if (Status s = check_room("resume", need, excluded); !s) {
    ++storage.stats.refused_resumes;
    return Status(s.code(), label(id) + ": " + s.message());
  }

  // Nothing can fail from here on.
  std::vector<std::pair<PageId, bool>> own;  // page, and whether it comes to the GPU
  for_each_page(rec, [&](PageId pid, const CacheGroup& g, uint64_t) {
    storage.pin(pid);
    own.push_back({pid, !(first && !rec.groups[g.id.value].selected)});
  });
  for (const PoolGroup& pg : plan.pool_groups()) {
    if (need[pg.id.value]) storage.make_room(kGpu, pg.id, need[pg.id.value]);
  }
  for (auto [pid, onboard] : own) {
    storage::Page& p = storage.page(pid);
    if (onboard && p.tier != TierKind::kGpu) storage.move(pid, kGpu);
    --p.suspended_refs;
    ++p.active_refs;
  }
  for (auto [pid, onboard] : own) storage.unpin(pid);
  if (first) finish_first_resume(rec);
  allocate_pages(rec, rec.capacity, rec.history, 0);
  const CopyEvent moved = storage.flush();
  for_each_page(rec, [&](PageId pid, const CacheGroup&, uint64_t) {
    if (storage.page(pid).ready.ticket > rec.ready.ticket) rec.ready = storage.page(pid).ready;
  });
  if (moved.ticket > rec.ready.ticket) rec.ready = moved;
  rec.state = CacheState::kActive;
  ++active_caches;
  ++storage.stats.resumes;
  rebuild_tables(rec);
  return Status::ok();
}

Status ManagerCore::suspend(uint32_t id) {
  if (Status s = expect_state(id, CacheState::kActive, "suspend"); !s) return s;
  CacheRecord& rec = caches[id];
  for_each_page(rec, [&](PageId pid, const CacheGroup&, uint64_t) {
    storage::Page& p = storage.page(pid);
    --p.active_refs;
    ++p.suspended_refs;
    storage.refresh(pid);
  });
  rec.state = CacheState::kSuspended;
  --active_caches;
  ++storage.stats.suspends;
  rebuild_tables(rec);
  return Status::ok();
}

Status ManagerCore::resize(uint32_t id, uint64_t capacity, uint64_t history) {
  if (Status s = expect_state(id, CacheState::kActive, "resize"); !s) return s;
  CacheRecord& rec = caches[id];
  if (history > capacity) {
    return Status::invalid(label(id) + ": resize: history " + std::to_string(history) +
                           " must be <= capacity " + std::to_string(capacity));
  }
  if (history < rec.history) {
    return Status::invalid(label(id) + ": resize: history " + std::to_string(history) +
                           " is below the current history " + std::to_string(rec.history) +
                           " (history only grows)");
  }
  const uint64_t blocks = blocks_for(capacity, plan.config().tokens_per_block);
  for (const CacheGroup& g : plan.cache_groups()) {
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
  // Blocks below `have` already hold every page they will ever need (released blocks are never
  // needed again: history only grows), so a resize looks only at what changes. This keeps a
  // decode step O(groups), not O(blocks).
  const uint64_t have = rec.attention_blocks;
  const std::vector<uint64_t> need = new_pages_needed(rec, capacity, history, have);
  if (Status s = check_room("resize", need, storage.empty_exclusions()); !s) {
    return Status(s.code(), label(id) + ": " + s.message());
  }
  for (const PoolGroup& pg : plan.pool_groups()) {
    if (need[pg.id.value]) storage.make_room(kGpu, pg.id, need[pg.id.value]);
  }
  allocate_pages(rec, capacity, history, have);
  const uint32_t tpb = plan.config().tokens_per_block;
  auto release_block = [&](GroupState& gs, uint64_t b) {
    PageId* row = &gs.pages[b * rec.beam_width];
    const uint32_t beams = b < rec.shared_blocks ? 1 : rec.beam_width;
    for (uint32_t k = 0; k < beams; ++k) {
      if (row[k] == kNoPage) continue;
      --storage.page(row[k]).active_refs;
      storage.refresh(row[k]);
    }
    std::fill(row, row + rec.beam_width, kNoPage);
  };
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind == GroupKind::kSsm) continue;
    GroupState& gs = rec.groups[g.id.value];
    // Window blocks that no step reads any more.
    if (g.window) {
      const uint64_t live_begin = (history > *g.window ? history - *g.window : 0) / tpb;
      const uint64_t stale_end = std::min(live_begin, have);
      for (uint64_t b = std::max<uint64_t>(gs.stale_from, g.sink_blocks); b < stale_end; ++b) {
        release_block(gs, b);
        set_table_entries(rec, g, b, b + 1);
      }
      gs.stale_from = std::max(gs.stale_from, stale_end);
    }
    // Blocks past a smaller capacity.
    for (uint64_t b = blocks; b < have; ++b) release_block(gs, b);
    gs.pages.resize(blocks * rec.beam_width, kNoPage);
    for (uint32_t k = 0; k < rec.beam_width; ++k) gs.tables[k].resize(blocks, kBadPageIndex);
    if (blocks > have) set_table_entries(rec, g, have, blocks);
  }
  rec.attention_blocks = blocks;
  const CopyEvent moved = storage.flush();
  if (moved.ticket > rec.ready.ticket) rec.ready = moved;
  rec.capacity = capacity;
  rec.history = history;
  return Status::ok();
}

void ManagerCore::set_table_entries(CacheRecord& rec, const CacheGroup& g, uint64_t from,
                                    uint64_t to) {
  GroupState& gs = rec.groups[g.id.value];
  for (uint32_t k = 0; k < rec.beam_width; ++k) {
    std::vector<int32_t>& table = gs.tables[k];
    std::span<int32_t> buffer = gs.index_buffers[k];
    for (uint64_t b = from; b < to; ++b) {
      const PageId id = gs.pages[b * rec.beam_width + k];
      table[b] = id == kNoPage ? kBadPageIndex : static_cast<int32_t>(storage.page(id).slot);
      if (b < buffer.size()) buffer[b] = table[b];
    }
  }
}

Status ManagerCore::close(uint32_t id) {
  CacheRecord& rec = caches[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition, label(id) + ": close of a CLOSED cache");
  }
  const bool active = rec.state == CacheState::kActive;
  for_each_page(rec, [&](PageId pid, const CacheGroup&, uint64_t) {
    storage::Page& p = storage.page(pid);
    if (active)
      --p.active_refs;
    else
      --p.suspended_refs;
    storage.refresh(pid);
  });
  for (GroupState& gs : rec.groups) std::fill(gs.pages.begin(), gs.pages.end(), kNoPage);
  (void)release_planned_drops(id);
  (void)stop_committing(id);
  if (active) --active_caches;
  --live_caches;
  rec.state = CacheState::kClosed;
  rebuild_tables(rec);
  return Status::ok();
}

void ManagerCore::destroy(uint32_t id) {
  if (caches[id].state != CacheState::kClosed) (void)close(id);
  caches[id] = CacheRecord{};
  free_ids.push_back(id);
}

Result<std::span<const int32_t>> ManagerCore::block_table(uint32_t id, CacheGroupId group,
                                                          uint32_t beam) const {
  if (Status s = check_group(id, group, beam); !s) return s;
  if (plan.cache_group(group).kind == GroupKind::kSsm) {
    return Status::invalid(label(id) + ": cache group " + std::to_string(group.value) +
                           " is an SSM group; use state_index");
  }
  const std::vector<int32_t>& table = caches[id].groups[group.value].tables[beam];
  return std::span<const int32_t>(table.data(), table.size());
}

Result<int32_t> ManagerCore::state_index(uint32_t id, CacheGroupId group, uint32_t beam) const {
  if (Status s = check_group(id, group, beam); !s) return s;
  if (plan.cache_group(group).kind != GroupKind::kSsm) {
    return Status::invalid(label(id) + ": cache group " + std::to_string(group.value) +
                           " is an attention group; use block_table");
  }
  const CacheRecord& rec = caches[id];
  const PageId pid = rec.groups[group.value].pages[beam];
  if (rec.state != CacheState::kActive || pid == kNoPage) return kBadPageIndex;
  return static_cast<int32_t>(storage.page(pid).slot);
}

Status ManagerCore::set_index_buffer(uint32_t id, CacheGroupId group, uint32_t beam,
                                     std::span<int32_t> buffer) {
  if (Status s = check_group(id, group, beam); !s) return s;
  CacheRecord& rec = caches[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": set_index_buffer on a CLOSED cache");
  }
  const bool ssm = plan.cache_group(group).kind == GroupKind::kSsm;
  const uint64_t want = ssm ? 1 : blocks_for(rec.capacity, plan.config().tokens_per_block);
  if (!buffer.empty() && buffer.size() < want) {
    return Status::invalid(label(id) + ": index buffer of " + std::to_string(buffer.size()) +
                           " entries for group " + std::to_string(group.value) + " needs " +
                           std::to_string(want));
  }
  rec.groups[group.value].index_buffers[beam] = buffer;
  write_index_buffers(rec);
  return Status::ok();
}

Status ManagerCore::set_block_priority(uint32_t id, uint64_t first, uint64_t end,
                                       int32_t priority) {
  CacheRecord& rec = caches[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": set_block_priority on a CLOSED cache");
  }
  if (first > end || end > (1ull << 32)) {
    return Status::invalid(label(id) + ": block range [" + std::to_string(first) + ", " +
                           std::to_string(end) + ") is not valid");
  }
  if (rec.block_priority.size() < end) rec.block_priority.resize(end, storage::kDefaultPriority);
  std::fill(rec.block_priority.begin() + static_cast<int64_t>(first),
            rec.block_priority.begin() + static_cast<int64_t>(end), priority);
  for_each_page(rec, [&](PageId pid, const CacheGroup& g, uint64_t block) {
    if (g.kind == GroupKind::kAttention && block >= first && block < end) {
      storage.set_priority(pid, priority);
      if (storage.page(pid).in_tree) on_page_moved(pid);  // reported as an update
    }
  });
  return Status::ok();
}

std::string ManagerCore::check() const {
  std::string err = storage.check();
  if (!err.empty()) return err;
  err = check_tree();
  if (!err.empty()) return err;
  // Every page's counts equal the caches that refer to it.
  std::map<PageId, std::pair<uint32_t, uint32_t>> refs;
  uint64_t live = 0, active = 0;
  for (uint32_t id = 0; id < caches.size(); ++id) {
    const CacheRecord& rec = caches[id];
    if (!rec.in_use || rec.state == CacheState::kClosed) continue;
    ++live;
    const bool is_active = rec.state == CacheState::kActive;
    active += is_active ? 1 : 0;
    std::string bad;
    for_each_page(rec, [&](PageId pid, const CacheGroup& g, uint64_t block) {
      const storage::Page& p = storage.page(pid);
      if (!p.live || p.group != g.id)
        bad = "cache " + std::to_string(id) + " holds a dead or foreign page";
      if (is_active && p.tier != TierKind::kGpu)
        bad = "active cache " + std::to_string(id) + " has a page off the GPU";
      auto& r = refs[pid];
      (is_active ? r.first : r.second)++;
      if (is_active && g.kind == GroupKind::kAttention) {
        for (uint32_t k = 0; k < rec.beam_width; ++k) {
          if (rec.groups[g.id.value].pages[block * rec.beam_width + k] == pid &&
              rec.groups[g.id.value].tables[k][block] != static_cast<int32_t>(p.slot)) {
            bad = "cache " + std::to_string(id) + ": block table disagrees with page " +
                  std::to_string(pid);
          }
        }
      }
    });
    if (!bad.empty()) return bad;
  }
  for (PageId pid = 0; pid < storage.page_capacity(); ++pid) {
    const storage::Page& p = storage.page(pid);
    if (!p.live) continue;
    const auto it = refs.find(pid);
    const uint32_t a = it == refs.end() ? 0 : it->second.first;
    const uint32_t s = it == refs.end() ? 0 : it->second.second;
    if (p.active_refs != a || p.suspended_refs != s) {
      return "page " + std::to_string(pid) + " counts (" + std::to_string(p.active_refs) + ", " +
             std::to_string(p.suspended_refs) + ") != holders (" + std::to_string(a) + ", " +
             std::to_string(s) + ")";
    }
  }
  if (live != live_caches || active != active_caches) return "live/active cache counters are off";
  return "";
}

std::string ManagerCore::snapshot() const {
  std::ostringstream os;
  os << storage.snapshot();
  for (uint32_t id = 0; id < caches.size(); ++id) {
    const CacheRecord& rec = caches[id];
    if (!rec.in_use) continue;
    os << "cache " << id << " " << cache_state_name(rec.state) << " cap " << rec.capacity
       << " hist " << rec.history << "\n";
    for (const GroupState& gs : rec.groups) {
      os << "  pages";
      for (PageId pid : gs.pages) os << " " << static_cast<int64_t>(pid == kNoPage ? -1 : pid);
      for (const auto& t : gs.tables) {
        os << " | table";
        for (int32_t v : t) os << " " << v;
      }
      os << "\n";
    }
  }
  os << "live " << live_caches << " active " << active_caches << " tree " << tree.size() << "\n";
  for (prefix::NodeId n = 0; n < tree.capacity(); ++n) {
    const prefix::Node& node = tree.node(n);
    if (!node.live) continue;
    os << "node " << n << " start " << node.start << " tokens " << node.tokens.size() << " pins "
       << node.pins;
    for (const prefix::NodePage& np : tree.pages(n)) {
      os << " " << static_cast<int64_t>(np.page == kNoPage ? -1 : np.page) << "/" << np.coverage;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace hybridkv::cache_detail
