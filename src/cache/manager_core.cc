#include "cache/manager_core.h"
#include "storage/room.h"

#include <algorithm>
#include <array>
#include <utility>

#include "util/blocks.h"
#include "util/check.h"
#include "util/dense_table.h"

namespace hybridkv::cache_detail {

using storage::kGpuTier;
using storage::Ref;

ManagerCore::ManagerCore(StoragePlan p, std::unique_ptr<memory::MemoryBackend> b)
    : plan_(std::move(p)),
      backend_(std::move(b)),
      storage_(plan_, backend_.get()),
      index_(plan_, storage_),
      memory_(*this),
      reads_(*this),
      shared_(*this) {}

Status ManagerCore::expect_state(uint32_t id, CacheState want, const char* op) const {
  const CacheRecord& rec = caches_[id];
  if (rec.state == want) return Status::ok();
  return Status(StatusCode::kFailedPrecondition, label(id) + ": " + op + " needs state " +
                                                     cache_state_name(want) + ", it is " +
                                                     cache_state_name(rec.state));
}

Status ManagerCore::check_group(uint32_t id, CacheGroupId group, uint32_t beam) const {
  if (group.value >= plan_.cache_groups().size()) {
    return Status::not_found(label(id) + ": unknown cache group " + std::to_string(group.value) +
                             " (the plan has " + std::to_string(plan_.cache_groups().size()) + ")");
  }
  if (beam >= caches_[id].beam_width) {
    return Status::invalid(label(id) + ": beam " + std::to_string(beam) + " >= beam width " +
                           std::to_string(caches_[id].beam_width));
  }
  return Status::ok();
}

// Every mutation while the metadata is small (every unit and randomized test: up to
// kCheckEveryOpUpTo slots, pages and tree nodes); beyond, once per size / kAmortizedCost mutations,
// so that a long simulation in a Debug build costs about kAmortizedCost entries of checking per
// mutation instead of the whole state.
void ManagerCore::after_mutation() const {
#ifdef HYBRIDKV_DEBUG_INVARIANTS
  constexpr uint64_t kCheckEveryOpUpTo = 4096;
  constexpr uint64_t kAmortizedCost = 64;
  uint64_t size = storage_.page_capacity() + index_.tree().capacity();
  for (const TierPlan& t : plan_.tiers()) {
    for (uint64_t slots : t.slots) size += slots;  // the checker walks every slot too
  }
  if (size > kCheckEveryOpUpTo && ++mutations_since_check_ * kAmortizedCost < size) return;
  mutations_since_check_ = 0;
  const std::string err = check_locked();
  HKV_CHECK(err.empty(), "invariant broken: %s", err.c_str());
#endif
}

bool ManagerCore::block_needed(const CacheGroup& group, uint64_t block, uint64_t capacity,
                               uint64_t history) const {
  const uint32_t tpb = plan_.config().tokens_per_block;
  return block < blocks_for(capacity, tpb) && group.block_live(block, history, tpb);
}

namespace {

// Pages of blocks [r.begin, r.end) that no row holds yet: one per block below the cache's
// shared blocks, one per beam above.
uint64_t fresh_pages(const CacheRecord& rec, BlockRange r) {
  if (r.size() == 0) return 0;
  const uint64_t shared = std::min(r.end, std::max(r.begin, rec.shared_blocks)) - r.begin;
  return shared + (r.size() - shared) * rec.beam_width;
}

BlockRange intersect(BlockRange a, BlockRange b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

}  // namespace

std::vector<uint64_t> ManagerCore::new_pages_needed(const CacheRecord& rec, uint64_t capacity,
                                                    uint64_t history, uint64_t from_block,
                                                    const std::vector<BlockRange>& skip) const {
  std::vector<uint64_t> need;
  new_pages_needed(rec, capacity, history, from_block, skip, need);
  return need;
}

void ManagerCore::new_pages_needed(const CacheRecord& rec, uint64_t capacity, uint64_t history,
                                   uint64_t from_block, const std::vector<BlockRange>& skip,
                                   std::vector<uint64_t>& need) const {
  need.assign(plan_.pool_groups().size(), 0);
  const uint32_t tpb = plan_.config().tokens_per_block;
  const uint64_t blocks = blocks_for(capacity, tpb);
  for (const CacheGroup& g : plan_.cache_groups()) {
    const GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) {
      need[g.pool_group.value] += std::count(gs.pages.begin(), gs.pages.end(), kNoPage);
      continue;
    }
    // Blocks the rows already cover: page by page (a row's holes at once where every block is
    // live and has one page).
    const uint64_t have = gs.pages.size() / rec.beam_width;
    const uint64_t covered = std::min(blocks, have);
    if (!g.window && skip.empty() && rec.beam_width == 1) {
      const auto row = gs.pages.begin();
      need[g.pool_group.value] +=
          std::count(row + std::min(from_block, covered), row + covered, kNoPage);
    } else {
      for (uint64_t b = from_block; b < covered; ++b) {
        if (!block_needed(g, b, capacity, history)) continue;
        if (!skip.empty() && skip[g.id.value].contains(b)) continue;
        for (uint32_t k = 0; k < rec.beams_at(b); ++k) {
          if (gs.pages[b * rec.beam_width + k] == kNoPage) ++need[g.pool_group.value];
        }
      }
    }
    // Blocks past the rows need every page: counted by ranges (a capacity of millions of
    // blocks costs nothing to refuse). Live: the sink blocks and everything from the window's
    // first live block on.
    const BlockRange past{std::max(from_block, have), blocks};
    if (past.size() == 0) continue;
    const BlockRange cut = skip.empty() ? BlockRange{} : skip[g.id.value];
    std::array<BlockRange, 2> live = {past, BlockRange{}};
    if (g.window) {
      const uint64_t first = std::max<uint64_t>(g.first_live_block(history, tpb), g.sink_blocks);
      live = {intersect(past, {0, g.sink_blocks}), intersect(past, {first, blocks})};
    }
    for (const BlockRange& r : live) {
      need[g.pool_group.value] += fresh_pages(rec, r) - fresh_pages(rec, intersect(r, cut));
    }
  }
}

int32_t ManagerCore::priority_of(const CacheRecord& rec, uint64_t block) const {
  return block < rec.block_priority.size() ? rec.block_priority[block] : storage::kDefaultPriority;
}

PageId ManagerCore::fresh_page(CacheRecord& rec, CacheGroupId group, int32_t priority) {
  const PageId id = storage_.allocate(group, kGpuTier, priority);
  storage_.add_ref(id, Ref::kActive);
  rec.note_ready(storage_.page(id).ready);
  return id;
}

// Planned first (every page and the row entries it fills), then allocated in one storage call.
void ManagerCore::allocate_pages(CacheRecord& rec, uint64_t capacity, uint64_t history,
                                 uint64_t from_block, const std::vector<BlockRange>& skip) {
  std::vector<storage::Storage::PageRequest> want;
  std::vector<std::pair<PageId*, uint32_t>> seats;  // the row entries each page fills
  auto seat = [&](PageId* at, uint32_t entries, CacheGroupId group, int32_t priority) {
    want.push_back({group, priority});
    seats.emplace_back(at, entries);
  };
  const uint64_t blocks = blocks_for(capacity, plan_.config().tokens_per_block);
  for (const CacheGroup& g : plan_.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) {
      for (PageId& id : gs.pages) {
        if (id == kNoPage) seat(&id, 1, g.id, storage::kDefaultPriority);
      }
      continue;
    }
    if (gs.pages.size() < blocks * rec.beam_width)
      gs.pages.resize(blocks * rec.beam_width, kNoPage);
    for (uint64_t b = from_block; b < blocks; ++b) {
      if (!block_needed(g, b, capacity, history)) continue;
      if (!skip.empty() && skip[g.id.value].contains(b)) continue;
      PageId* row = rec.row(g.id, b);
      if (b < rec.shared_blocks) {
        if (row[0] == kNoPage) seat(row, rec.beam_width, g.id, priority_of(rec, b));
        continue;
      }
      for (uint32_t k = 0; k < rec.beam_width; ++k) {
        if (row[k] == kNoPage) seat(row + k, 1, g.id, priority_of(rec, b));
      }
    }
  }
  if (want.empty()) return;
  const std::vector<PageId> pages = storage_.allocate_active(want);
  for (size_t i = 0; i < pages.size(); ++i) {
    std::fill(seats[i].first, seats[i].first + seats[i].second, pages[i]);
    rec.note_ready(storage_.page(pages[i]).ready);
  }
}

Status ManagerCore::check_room(const char* op, const std::vector<uint64_t>& need,
                               const storage::Exclusions* excluded) const {
  for (const PoolGroup& pg : plan_.pool_groups()) {
    const uint64_t n = need[pg.id.value];
    if (n == 0) continue;
    const uint64_t own = excluded ? (*excluded)[kGpuTier.value][pg.id.value] : 0;
    const uint64_t room = storage_.max_room(kGpuTier, pg.id, own);
    if (room < n) {
      return Status(
          StatusCode::kOutOfPages,
          std::string(op) + ": pool group " + std::to_string(pg.id.value) + " (GPU) needs " +
              std::to_string(n) + " more slots; " + std::to_string(room) + " of " +
              std::to_string(storage_.counts(kGpuTier, pg.id).total) + " can be made free");
    }
  }
  return Status::ok();
}

void ManagerCore::make_room(const std::vector<uint64_t>& need) {
  for (const PoolGroup& pg : plan_.pool_groups()) {
    if (need[pg.id.value]) storage::make_room(storage_, kGpuTier, pg.id, need[pg.id.value], index_);
  }
}

void ManagerCore::deliver_notices() { storage::deliver_notices(storage_, index_); }

void ManagerCore::rebuild_tables(CacheRecord& rec) {
  const uint64_t blocks = blocks_for(rec.capacity, plan_.config().tokens_per_block);
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kSsm) continue;
    GroupState& gs = rec.groups[g.id.value];
    for (uint32_t k = 0; k < rec.beam_width; ++k) {
      std::vector<int32_t>& table = gs.tables[k];
      table.assign(blocks, kBadPageIndex);
      if (!rec.active()) continue;
      for (uint64_t b = 0; b < blocks && b * rec.beam_width + k < gs.pages.size(); ++b) {
        const PageId id = gs.pages[b * rec.beam_width + k];
        if (id != kNoPage) table[b] = static_cast<int32_t>(storage_.page(id).slot.value);
      }
    }
  }
  write_index_buffers(rec);
}

bool ManagerCore::follow_moved_pages(CacheRecord& rec, std::span<const PoolMoves> moves) {
  bool moved = false;
  for (const CacheGroup& g : plan_.cache_groups()) {
    const PoolMoves& m = moves[g.pool_group.value];
    if (m.end == PoolMoves::kNoEnd) continue;
    GroupState& gs = rec.groups[g.id.value];
    for (uint32_t k = 0; k < rec.beam_width; ++k) {
      std::span<int32_t> buffer = gs.index_buffers[k];
      if (g.kind == GroupKind::kSsm) {  // one state per beam: moved if that batch wrote it
        if (gs.pages[k] == kNoPage || storage_.page(gs.pages[k]).ready.ticket != m.ticket) continue;
        if (!buffer.empty())
          buffer[0] = static_cast<int32_t>(storage_.page(gs.pages[k]).slot.value);
        moved = true;
        continue;
      }
      // A block's page moved iff its slot was at or above the end: only those entries change.
      std::vector<int32_t>& table = gs.tables[k];
      for (uint64_t b = 0; b < table.size(); ++b) {
        if (table[b] < 0 || static_cast<uint64_t>(table[b]) < m.end) continue;
        table[b] = static_cast<int32_t>(storage_.page(gs.pages[b * rec.beam_width + k]).slot.value);
        if (b < buffer.size()) buffer[b] = table[b];
        moved = true;
      }
    }
  }
  return moved;
}

void ManagerCore::write_index_buffers(CacheRecord& rec) {
  for (const CacheGroup& g : plan_.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    for (uint32_t k = 0; k < rec.beam_width; ++k) {
      std::span<int32_t> buffer = gs.index_buffers[k];
      if (buffer.empty()) continue;
      std::fill(buffer.begin(), buffer.end(), kBadPageIndex);
      if (!rec.active()) continue;
      if (g.kind == GroupKind::kSsm) {
        if (gs.pages[k] != kNoPage)
          buffer[0] = static_cast<int32_t>(storage_.page(gs.pages[k]).slot.value);
      } else {
        std::copy(gs.tables[k].begin(), gs.tables[k].end(), buffer.begin());
      }
    }
  }
}

void ManagerCore::set_table_entries(CacheRecord& rec, const CacheGroup& g, uint64_t from,
                                    uint64_t to) {
  GroupState& gs = rec.groups[g.id.value];
  for (uint32_t k = 0; k < rec.beam_width; ++k) {
    std::vector<int32_t>& table = gs.tables[k];
    std::span<int32_t> buffer = gs.index_buffers[k];
    for (uint64_t b = from; b < to; ++b) {
      const PageId id = gs.pages[b * rec.beam_width + k];
      table[b] = id == kNoPage ? kBadPageIndex : static_cast<int32_t>(storage_.page(id).slot.value);
      if (b < buffer.size()) buffer[b] = table[b];
    }
  }
}

// Each beam holds its own page of every cache group (past the prompt; its own state): more
// beams than a GPU pool group could ever hold can never run, and are refused before any row
// is sized for them.
Status ManagerCore::check_beam_width(uint32_t beam_width) const {
  const TierPlan& gpu = plan_.tiers().front();
  for (const CacheGroup& g : plan_.cache_groups()) {
    const uint64_t most = gpu.reserved_slots[g.pool_group.value];
    if (beam_width > most && plan_.pool_group(g.pool_group).slot_bytes > 0) {
      return Status::invalid("beam_width " + std::to_string(beam_width) +
                             ": each beam needs its own page of cache group " +
                             std::to_string(g.id.value) + "; its GPU pool group " +
                             std::to_string(g.pool_group.value) + " holds at most " +
                             std::to_string(most));
    }
  }
  return Status::ok();
}

// Every check comes before anything is taken from `options` (an error leaves them whole).
Result<uint32_t> ManagerCore::create(CacheOptions&& options) {
  std::unique_lock lock(mu_);
  const ManagerConfig& config = plan_.config();
  if (shut_down_) return Status(StatusCode::kFailedPrecondition, "the manager is shut down");
  if (options.beam_width == 0) return Status::invalid("beam_width 0 must be > 0");
  if (options.swa_scratch.value_or(false) && !config.swa_scratch_reuse) {
    return Status::invalid(
        "swa_scratch needs ManagerConfig::swa_scratch_reuse (the plan reserves the scratch slots)");
  }
  if (config.max_live_kv_caches && live_caches_ >= *config.max_live_kv_caches) {
    return Status(StatusCode::kRefused, "max_live_kv_caches " +
                                            std::to_string(*config.max_live_kv_caches) +
                                            " living caches already exist");
  }
  if (Status s = check_beam_width(options.beam_width); !s) return s;
  if (options.prompt_keys) {
    if (Status s = CoreAccess::check_keys(*options.prompt_keys, config, options.scope,
                                          options.input_tokens, options.multimodal);
        !s)
      return s;
  }
  if (options.beam_width > 1) {
    for (const PoolGroup& pg : plan_.pool_groups()) {
      if (pg.fixed_private) {
        return Status(StatusCode::kRefused,
                      "beam_width " + std::to_string(options.beam_width) +
                          " needs one PRIVATE state per beam; the fixed PRIVATE pool (pool group " +
                          std::to_string(pg.id.value) + ", max_live_kv_caches) has one per cache");
      }
    }
  }
  const uint32_t id = take_dense_id(caches_, free_ids_);
  CacheRecord& rec = caches_[id];
  rec.in_use = true;
  rec.label = options.label;
  rec.state = CacheState::kSuspended;
  rec.beam_width = options.beam_width;
  rec.scratch_on = options.swa_scratch.value_or(config.swa_scratch_reuse);
  rec.scope = options.scope;
  rec.tokens = std::move(options.input_tokens);
  rec.shared_blocks = options.beam_width > 1 ? rec.tokens.size() / config.tokens_per_block : 0;
  rec.groups.resize(plan_.cache_groups().size());
  for (const CacheGroup& g : plan_.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) gs.pages.assign(rec.beam_width, kNoPage);
    gs.tables.resize(rec.beam_width);
    gs.index_buffers.resize(rec.beam_width);
  }
  rec.multimodal = std::move(options.multimodal);
  std::span<const BlockKey> keys;
  if (options.prompt_keys) {
    // Shares the caller's keys: the record keeps them alive for its commits.
    rec.prompt_keys = std::shared_ptr<const std::vector<BlockKey>>(
        options.prompt_keys, &CoreAccess::keys_of(*options.prompt_keys));
    keys = *rec.prompt_keys;
  }
  attach_match(rec, index_.match_and_mark_demand(rec.scope, rec.tokens, rec.multimodal, keys));
  ++live_caches_;
  after_mutation();
  return id;
}

// Deepest blocks first (for_each_page): the pages enter the eviction queues in that order, so
// that LRU evicts a released path from its end, not a block every deeper one needs.
void ManagerCore::release_all_pages(CacheRecord& rec) {
  const Ref ref = rec.active() ? Ref::kActive : Ref::kSuspended;
  for_each_page(rec, [&](PageId pid, const CacheGroup&, uint64_t) { storage_.drop_ref(pid, ref); });
  for (GroupState& gs : rec.groups) std::fill(gs.pages.begin(), gs.pages.end(), kNoPage);
  release_held(rec, UINT64_MAX);
  release_scratch(rec);
  release_reserved(rec, UINT64_MAX);
}

Status ManagerCore::close(uint32_t id) {
  std::unique_lock lock(mu_);
  CacheRecord& rec = caches_[id];
  if (rec.state == CacheState::kClosed) return Status::ok();  // idempotent (DESIGN §5)
  const bool active = rec.active();
  drop_path_hold(rec);  // before its pages are queued
  release_all_pages(rec);
  (void)stop_committing_locked(id);
  if (active) --active_caches_;
  --live_caches_;
  rec.state = CacheState::kClosed;
  rebuild_tables(rec);
  after_mutation();
  return Status::ok();
}

void ManagerCore::destroy(uint32_t id) {
  if (info(id).state != CacheState::kClosed) (void)close(id);
  std::unique_lock lock(mu_);
  caches_[id] = CacheRecord{};
  free_ids_.push_back(id);
}

Status ManagerCore::set_index_buffer(uint32_t id, CacheGroupId group, uint32_t beam,
                                     std::span<int32_t> buffer) {
  std::unique_lock lock(mu_);
  if (Status s = check_group(id, group, beam); !s) return s;
  CacheRecord& rec = caches_[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": set_index_buffer on a CLOSED cache");
  }
  const bool ssm = plan_.cache_group(group).kind == GroupKind::kSsm;
  const uint64_t want = ssm ? 1 : blocks_for(rec.capacity, plan_.config().tokens_per_block);
  if (!buffer.empty() && buffer.size() < want) {
    return Status::invalid(label(id) + ": index buffer of " + std::to_string(buffer.size()) +
                           " entries for group " + std::to_string(group.value) + " needs " +
                           std::to_string(want));
  }
  rec.groups[group.value].index_buffers[beam] = buffer;
  rec.index_buffer_room = UINT64_MAX;
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kSsm) continue;  // one entry: any buffer set holds it
    for (std::span<int32_t> b : rec.groups[g.id.value].index_buffers)
      if (!b.empty()) rec.index_buffer_room = std::min<uint64_t>(rec.index_buffer_room, b.size());
  }
  write_index_buffers(rec);
  return Status::ok();
}

Status ManagerCore::set_block_priority(uint32_t id, uint64_t first, uint64_t end,
                                       int32_t priority) {
  std::unique_lock lock(mu_);
  CacheRecord& rec = caches_[id];
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
    if (g.kind == GroupKind::kAttention && block >= first && block < end)
      storage_.set_priority(pid, priority);
  });
  for (const GroupState& gs : rec.groups) {  // window pages HELD until their commit
    for (uint64_t i = 0; i < gs.held.size(); ++i) {
      const uint64_t block = gs.held_begin + i;
      if (gs.held[i] != kNoPage && block >= first && block < end)
        storage_.set_priority(gs.held[i], priority);
    }
  }
  deliver_notices();
  after_mutation();
  return Status::ok();
}

}  // namespace hybridkv::cache_detail
