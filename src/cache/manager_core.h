// ManagerCore: the per-request state machine behind KvCacheManager and every KvCache handle
// (DESIGN §5). It keeps one CacheRecord per request and drives create / resume / suspend /
// resize / commit / close through storage (page references, room, copies) and the prefix index
// (matches, publishing, planned drops).
//
// Thread-safety: every public method takes mu_ itself: mutations exclusively, reads shared.
// Handles are shared owners (a KvCache keeps the core alive after its manager is gone).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_record.h"
#include "cache/manager_reads.h"
#include "cache/memory_control.h"
#include "cache/shared_link.h"
#include "hybridkv/manager.h"
#include "memory/backend.h"
#include "prefix/prefix_index.h"
#include "storage/storage.h"

namespace hybridkv::cache_detail {

// A cache's scalar fields, read together under one lock.
struct CacheInfo {
  CacheState state = CacheState::kClosed;
  uint64_t capacity = 0;
  uint64_t history = 0;
  uint32_t beam_width = 1;
  uint64_t committed = 0;
  CopyEvent ready;
};

// Whether a group's pages may enter the prefix tree (and the shared tier): not PRIVATE.
inline bool publishable(const CacheGroup& g) { return g.policy != ReusePolicy::kPrivate; }

// The core behind a KvCacheManager handle, for the implementation's own libraries (the
// public classes are handles over it).
struct CoreAccess {
  static const ManagerCore& of(const KvCacheManager& manager) { return *manager.core_; }
  // PromptKeys' parts (keys.cc).
  static std::shared_ptr<const PromptKeys> make_keys(const ManagerConfig& config,
                                                     const ReuseScope& scope,
                                                     std::span<const int32_t> tokens,
                                                     std::span<const MultimodalItem> multimodal,
                                                     std::vector<BlockKey> keys);
  // Ok when `keys` were computed for exactly this prompt on a manager of this config; the
  // error names what differs.
  static Status check_keys(const PromptKeys& keys, const ManagerConfig& config,
                           const ReuseScope& scope, std::span<const int32_t> tokens,
                           std::span<const MultimodalItem> multimodal);
  static const std::vector<BlockKey>& keys_of(const PromptKeys& keys) { return keys.keys_; }
  // The cache's own tokens (ManagerCore::tokens): the hybrid manager reads its prompt there
  // instead of keeping a second copy.
  static std::span<const int32_t> tokens(const KvCache& cache);
};

class ManagerCore {
 public:
  ManagerCore(StoragePlan plan, std::unique_ptr<memory::MemoryBackend> backend);

  // Immutable after construction: no lock.
  const StoragePlan& plan() const { return plan_; }
  memory::MemoryBackend& backend() const { return *backend_; }

  // --- one cache (exclusive lock) ---
  Result<uint32_t> create(CacheOptions&& options);
  Status resume(uint32_t id, const std::vector<CacheGroupId>& optional_groups);
  // What resume() would answer now, changing nothing (shared lock).
  Status can_resume(uint32_t id, const std::vector<CacheGroupId>& optional_groups) const;
  Status suspend(uint32_t id);
  // Onboards at most max_pages away pages of a SUSPENDED cache; how many it onboarded.
  Result<uint64_t> prefetch(uint32_t id, uint64_t max_pages);
  // Pages of a SUSPENDED cache on a colder tier (shared lock).
  Result<uint64_t> pages_away(uint32_t id) const;
  Status resize(uint32_t id, uint64_t capacity, uint64_t history);
  struct ResizeCall {
    uint32_t id = 0;
    uint64_t capacity = 0;
    uint64_t history = 0;
  };
  // Several resizes as one operation: all succeed, or none changes anything.
  Status resize_all(std::span<const ResizeCall> calls);
  // snapshot false: full blocks only (no partial tail, no SSM state).
  // `snapshot`: nullopt publishes KV only (KvCache::commit_kv).
  Status commit(uint32_t id, std::span<const int32_t> tokens, bool is_end,
                std::optional<SnapshotRole> snapshot);
  Status stop_committing(uint32_t id);
  // A planned drop's id (never reused), and its release (kNotFound once released).
  Result<uint64_t> plan_snapshot_drop(uint32_t id);
  Status release_drop(uint64_t drop);
  Status close(uint32_t id);
  void destroy(uint32_t id);  // the handle is gone: close if open, recycle the id
  Status set_index_buffer(uint32_t id, CacheGroupId group, uint32_t beam,
                          std::span<int32_t> buffer);
  Status set_block_priority(uint32_t id, uint64_t first, uint64_t end, int32_t priority);
  Status set_swa_scratch(uint32_t id, bool on);
  Result<ScratchDesc> scratch(uint32_t id, CacheGroupId group) const;

  // --- reads of one cache (shared lock) ---
  CacheInfo info(uint32_t id) const;
  // The cache's tokens: its prompt, then what commits added past it. Valid until a commit
  // appends to them or the cache is destroyed.
  std::span<const int32_t> tokens(uint32_t id) const;
  ReuseMatch reuse_match(uint32_t id) const;
  Result<std::span<const int32_t>> block_table(uint32_t id, CacheGroupId group,
                                               uint32_t beam) const;
  Result<int32_t> state_index(uint32_t id, CacheGroupId group, uint32_t beam) const;

  // --- the whole manager: one part per concern, each with its own state ---
  MemoryControl& memory() { return memory_; }
  const MemoryControl& memory() const { return memory_; }
  ManagerReads& reads() { return reads_; }
  const ManagerReads& reads() const { return reads_; }
  SharedLink& shared() { return shared_; }
  const SharedLink& shared() const { return shared_; }

 private:
  friend class MemoryControl;
  friend class ManagerReads;
  friend class SharedLink;

  // All private members: Requires mu_ held (exclusively where they change anything).
  Status expect_state(uint32_t id, CacheState want, const char* op) const;
  Status check_group(uint32_t id, CacheGroupId group, uint32_t beam) const;
  Status check_beam_width(uint32_t beam_width) const;
  std::string label(uint32_t id) const {
    return caches_[id].label.empty() ? "cache " + std::to_string(id) : caches_[id].label;
  }
  // Debug builds: aborts with the first broken invariant after a mutation (DESIGN §9).
  void after_mutation() const;
  std::string check_locked() const;
  // Visits every distinct page of a cache once, deepest block first: fn(page, group, block).
  template <typename Fn>
  void for_each_page(const CacheRecord& rec, Fn&& fn) const {
    (void)for_each_page_while(rec, [&](PageId id, const CacheGroup& g, uint64_t b) {
      fn(id, g, b);
      return true;
    });
  }
  // The same while fn returns true; whether every page was visited.
  template <typename Fn>
  bool for_each_page_while(const CacheRecord& rec, Fn&& fn) const;
  void release_all_pages(CacheRecord& rec);
  // Is block b of an attention group live at (capacity, history)?
  bool block_needed(const CacheGroup& group, uint64_t block, uint64_t capacity,
                    uint64_t history) const;
  // Fresh pages per pool group that (capacity, history) needs beyond what the cache holds.
  // Only blocks from `from_block` on are looked at.
  // Blocks of `skip` (per group; SWA scratch) get no page.
  std::vector<uint64_t> new_pages_needed(const CacheRecord& rec, uint64_t capacity,
                                         uint64_t history, uint64_t from_block,
                                         const std::vector<BlockRange>& skip = {}) const;
  // The same into `need` (its capacity reused: a decode step's resize allocates nothing).
  void new_pages_needed(const CacheRecord& rec, uint64_t capacity, uint64_t history,
                        uint64_t from_block, const std::vector<BlockRange>& skip,
                        std::vector<uint64_t>& need) const;
  // Allocates those pages on the GPU (room already made) with an active ref.
  void allocate_pages(CacheRecord& rec, uint64_t capacity, uint64_t history, uint64_t from_block,
                      const std::vector<BlockRange>& skip = {});
  PageId fresh_page(CacheRecord& rec, CacheGroupId group, int32_t priority);
  // Refuses with kOutOfPages when GPU room for `need` cannot be made (the `excluded` pages of
  // the operation's own caches are no room for it).
  Status check_room(const char* op, const std::vector<uint64_t>& need,
                    const storage::Exclusions* excluded = nullptr) const;
  void make_room(const std::vector<uint64_t>& need);
  // Hands storage's notices (owned pages moved or re-prioritized) to the index.
  void deliver_notices();
  // Block-table (and index-buffer) entries [from, to) of an attention group, every beam.
  void set_table_entries(CacheRecord& rec, const CacheGroup& g, uint64_t from, uint64_t to);
  void rebuild_tables(CacheRecord& rec);
  void write_index_buffers(CacheRecord& rec);
  // A GPU pool group shrank to `end` slots, moving the pages that sat at or above it in the
  // batch `ticket` (end kNoEnd: it moved nothing).
  struct PoolMoves {
    static constexpr uint64_t kNoEnd = UINT64_MAX;
    uint64_t end = kNoEnd;
    uint64_t ticket = 0;
  };
  // After such moves (one entry per pool group), the table and index-buffer entries that named
  // a moved page follow it. Returns whether any did (the cache then waits for the moves).
  bool follow_moved_pages(CacheRecord& rec, std::span<const PoolMoves> moves);
  int32_t priority_of(const CacheRecord& rec, uint64_t block) const;

  // resume.cc
  struct ResumeNeeds;
  Status resume_locked(uint32_t id, const std::vector<CacheGroupId>& optional_groups);
  // The checks of a resume (state, OPTIONAL choice, utilization gate, room) on `rec`.
  // `needs` receives what the resume needs (the same computation the resume then uses).
  Status resume_allowed(uint32_t id, const CacheRecord& rec, bool first, ResumeNeeds& needs) const;
  // `fresh`: new_pages_needed at the cache's capacity and history.
  // `headroom`: slots per GPU pool group the utilization gate lets the resume lock; the walk
  // stops once it has counted more (ResumeNeeds::over_gate), the refusal certain.
  ResumeNeeds resume_needs(const CacheRecord& rec, bool first, const std::vector<uint64_t>& fresh,
                           const std::vector<uint64_t>& headroom) const;
  // What the gate lets a resume lock per GPU pool group (0 where it is already past it).
  std::vector<uint64_t> utilization_headroom() const;
  Status utilization_gate(uint32_t id, const std::vector<uint64_t>& locked_by_resume,
                          bool fresh_only, bool partial = false) const;
  void attach_match(CacheRecord& rec, const prefix::MatchPlan& plan);
  Status choose_optional_groups(uint32_t id, const std::vector<CacheGroupId>& chosen,
                                CacheRecord& rec) const;
  Status optional_selection(uint32_t id, const std::vector<CacheGroupId>& chosen,
                            const CacheRecord& rec, std::vector<bool>& selected) const;
  void apply_selection(CacheRecord& rec, const std::vector<bool>& selected) const;
  bool selection_unchanged(const CacheRecord& rec, const std::vector<bool>& selected) const;
  void finish_first_resume(CacheRecord& rec);
  void give_back_unselected(CacheRecord& rec, const CacheGroup& g);
  PageId private_copy(const CacheGroup& g, PageId src);
  void record_lookup(const CacheRecord& rec, bool optional_only);

  // scratch.cc
  // Into `out`, one range per cache group (its capacity reused).
  void scratch_plan(const CacheRecord& rec, uint64_t capacity, uint64_t history, uint64_t have,
                    std::vector<BlockRange>& out) const;
  void add_scratch_needs(const CacheRecord& rec, const std::vector<BlockRange>& plan,
                         std::vector<uint64_t>& need) const;
  void set_scratch(CacheRecord& rec, const std::vector<BlockRange>& plan);
  void release_scratch(CacheRecord& rec);
  Status check_scratch_history(uint32_t id, uint64_t history) const;

  // resize.cc: a resize is planned (every check and the pages it needs, nothing changed), its
  // room checked, then applied.
  struct ResizePlan {
    uint32_t id = 0;
    uint64_t capacity = 0;
    uint64_t history = 0;
    uint64_t have = 0;                // attention blocks the cache held
    std::vector<BlockRange> scratch;  // per cache group
    std::vector<uint64_t> need;       // fresh GPU pages per pool group
    bool in_place = false;            // no page changes: only capacity and history (decode)
  };
  // Whether a resize to `capacity` changes no page of `rec`: the same attention blocks, every
  // state page present, and no window group (whose stale blocks and scratch move with history).
  bool changes_no_page(const CacheRecord& rec, uint64_t capacity) const;
  Status plan_resize(uint32_t id, uint64_t capacity, uint64_t history, ResizePlan& out) const;
  // Requires: room for p.need checked.
  void apply_resize(const ResizePlan& p);
  Status check_capacity(uint32_t id, uint64_t capacity) const;
  Status check_index_buffers(uint32_t id, uint64_t capacity) const;
  using RefChanges = std::vector<storage::Storage::RefChange>;
  // Clears the block's row entries; the references they held join `changes`.
  void release_block(CacheRecord& rec, CacheGroupId group, uint64_t block, RefChanges& changes);
  // Does block `block` of window group `g`, leaving the window now, stay HELD until a commit?
  bool holds_until_commit(const CacheRecord& rec, const CacheGroup& g, uint64_t block) const;
  void hold_stale_block(CacheRecord& rec, const CacheGroup& g, uint64_t block, RefChanges& changes);
  // Frees held pages of blocks below `end_block` (every held page with UINT64_MAX).
  void release_held(CacheRecord& rec, uint64_t end_block);
  void release_stale_and_cut(CacheRecord& rec, uint64_t capacity, uint64_t history);

  // commit.cc
  Status check_commit(uint32_t id, std::span<const int32_t> tokens) const;
  void commit_full_block(CacheRecord& rec, uint64_t block);
  prefix::NodeId commit_tail(CacheRecord& rec, uint64_t end, bool is_end);
  void commit_snapshots(CacheRecord& rec, prefix::NodeId node, bool is_end, SnapshotRole role,
                        std::optional<size_t> reserved);
  std::vector<uint64_t> commit_pages(bool tail_moves, bool state_moves, bool tail,
                                     bool snapshot) const;
  // chunk_states.cc
 public:
  Result<std::vector<uint64_t>> reserve_states(uint32_t id, std::span<const uint64_t> points,
                                               SnapshotRole role);
  Result<std::vector<int32_t>> reserved_state_slots(uint32_t id, CacheGroupId group) const;

 private:
  Status check_reserve(const CacheRecord& rec, std::span<const uint64_t> points) const;
  // The index of a reservation at `point`, if any.
  static std::optional<size_t> reserved_at(const CacheRecord& rec, uint64_t point);
  // Frees the reservations at points <= upto (UINT64_MAX: all).
  void release_reserved(CacheRecord& rec, uint64_t upto);
  bool room_without_loss(std::span<const uint64_t> need) const;
  void move_commit_parent(CacheRecord& rec, prefix::NodeId next, bool held);
  bool holds_block(const CacheRecord& rec, prefix::NodeId node, uint64_t b) const;
  std::string check_path_holds() const;
  // An ACTIVE cache's path counts as resumable while it commits (PrefixIndex::hold_resumable):
  // taken on resume and at the first commit, moved with the commit parent, dropped before its
  // pages are released or suspended.
  void take_path_hold(CacheRecord& rec);
  void drop_path_hold(CacheRecord& rec);
  static constexpr uint64_t kPrefetchBlocks = 8;  // how far ahead commit loads key slots
  void prefetch_key(const CacheRecord& rec, uint64_t b) const;
  Status stop_committing_locked(uint32_t id);

  mutable std::shared_mutex mu_;  // guards everything below; plan_ and backend_ are immutable
  const StoragePlan plan_;
  const std::unique_ptr<memory::MemoryBackend> backend_;
  storage::Storage storage_;
  prefix::PrefixIndex index_;
  std::vector<CacheRecord> caches_;  // by cache id; in_use marks the taken ids
  std::vector<uint32_t> free_ids_;
  uint64_t live_caches_ = 0;  // ACTIVE + SUSPENDED records
  uint64_t active_caches_ = 0;
  bool shut_down_ = false;
  // Planned drops by id: the (node, group) pages each releases. They belong to their handles,
  // not to a cache: a plan outlives the cache that made it.
  std::unordered_map<uint64_t, std::vector<std::pair<prefix::NodeId, CacheGroupId>>> drops_;
  uint64_t next_drop_ = 1;
  ResizePlan resize_plan_;  // resize()'s plan, kept so that its vectors keep their capacity
  mutable uint64_t mutations_since_check_ = 0;  // Debug builds: see after_mutation()
  // The manager-wide parts (constructed last: they read the state above).
  MemoryControl memory_;
  ManagerReads reads_;
  SharedLink shared_;
};

template <typename Fn>
bool ManagerCore::for_each_page_while(const CacheRecord& rec, Fn&& fn) const {
  for (const CacheGroup& g : plan_.cache_groups()) {
    const GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kSsm) {
      for (PageId id : gs.pages) {
        if (id != kNoPage && !fn(id, g, uint64_t{0})) return false;
      }
      continue;
    }
    const uint64_t blocks = gs.pages.size() / rec.beam_width;
    for (uint64_t b = blocks; b-- > 0;) {  // deepest first (see release_all_pages)
      for (uint32_t k = 0; k < rec.beams_at(b); ++k) {
        const PageId id = gs.pages[b * rec.beam_width + k];
        if (id != kNoPage && !fn(id, g, b)) return false;
      }
    }
  }
  return true;
}

}  // namespace hybridkv::cache_detail
