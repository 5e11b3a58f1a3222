// ManagerCore: the state behind KvCacheManager and every KvCache handle, behind one mutex.
#pragma once

#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "hybridkv/kv_cache.h"
#include "hybridkv/manager.h"
#include "memory/backend.h"
#include "prefix/block_hash.h"
#include "prefix/radix_tree.h"
#include "storage/storage.h"

namespace hybridkv::cache_detail {

using storage::kNoPage;
using storage::PageId;

struct GroupState {
  // Attention: pages[block * beam_width + beam]; SSM: pages[beam]. Blocks below the cache's
  // shared_blocks hold one page in every beam entry. kNoPage: not allocated, or released.
  std::vector<PageId> pages;
  std::vector<std::vector<int32_t>> tables;       // per beam: GPU slots (attention groups)
  std::vector<std::span<int32_t>> index_buffers;  // per beam, caller-owned (may be empty)
  uint64_t stale_from = 0;  // window groups: blocks below this were released as stale
  // Reuse: the page in the last block (attention) or the state (SSM) is a tree page that the
  // first resume copies into a private page before anything writes it.
  bool copy_pending = false;
  bool selected = true;  // OPTIONAL groups: chosen at the first resume (others: always)
};

// What a match found, with the nodes behind it (see ManagerCore::match).
struct MatchPlan {
  ReuseMatch match;
  prefix::NodeId root = prefix::kNoNode;
  std::vector<prefix::NodeId> path;       // full nodes of blocks 0, 1, ...
  prefix::NodeId tail = prefix::kNoNode;  // node of the partially used last block, if any
  uint64_t tail_tokens = 0;               // tokens of the tail node matched
};

struct CacheRecord {
  bool in_use = false;
  CacheState state = CacheState::kSuspended;
  uint64_t capacity = 0;
  uint64_t history = 0;
  uint32_t beam_width = 1;
  uint64_t shared_blocks = 0;  // blocks wholly inside the prompt: one page for every beam
  ReuseScope scope;
  std::vector<int32_t> tokens;
  uint64_t attention_blocks = 0;        // blocks of every attention group's pages vector
  std::vector<GroupState> groups;       // by cache group id
  std::vector<int32_t> block_priority;  // explicit priorities by block (default elsewhere)
  CopyEvent ready;
  // Reuse.
  std::vector<MultimodalItem> multimodal;
  ReuseMatch match;  // what create() matched
  bool first_resume_done = false;
  bool committing = true;                          // until stop_committing() or an is_end commit
  uint64_t committed = 0;                          // tokens published (or reused) so far
  prefix::NodeId commit_parent = prefix::kNoNode;  // full node the next block hangs under; pinned
  // Snapshot nodes this cache plans to release (release_planned_drops executes them).
  std::vector<std::pair<prefix::NodeId, uint32_t>> planned_drops;
};

class ManagerCore {
 public:
  ManagerCore(StoragePlan plan, std::unique_ptr<memory::MemoryBackend> backend);

  mutable std::shared_mutex mu;
  StoragePlan plan;
  std::unique_ptr<memory::MemoryBackend> backend;
  storage::Storage storage;
  std::vector<CacheRecord> caches;
  std::vector<uint32_t> free_ids;
  uint64_t live_caches = 0;
  uint64_t active_caches = 0;
  bool shut_down = false;
  prefix::RadixTree tree;
  prefix::BlockHasher hasher;
  std::vector<CacheEvent> events;
  ReuseStats reuse_stats;

  // All Requires: mu held.
  Result<uint32_t> create(const CacheOptions& options);
  Status resume(uint32_t id, const std::vector<CacheGroupId>* optional_groups);
  Status suspend(uint32_t id);
  Status resize(uint32_t id, uint64_t capacity, uint64_t history);
  Status close(uint32_t id);
  void destroy(uint32_t id);  // the handle is gone: close if open, recycle the id
  Result<std::span<const int32_t>> block_table(uint32_t id, CacheGroupId group,
                                               uint32_t beam) const;
  Result<int32_t> state_index(uint32_t id, CacheGroupId group, uint32_t beam) const;
  Status set_index_buffer(uint32_t id, CacheGroupId group, uint32_t beam,
                          std::span<int32_t> buffer);
  Status set_block_priority(uint32_t id, uint64_t first, uint64_t end, int32_t priority);
  std::string check() const;
  std::string snapshot() const;

  // Reuse (reuse.cc). All Requires: mu held (match: shared is enough, it only reads).
  MatchPlan match(prefix::BlockHasher& hasher, const ReuseScope& scope,
                  std::span<const int32_t> tokens,
                  std::span<const MultimodalItem> multimodal) const;
  Status commit(uint32_t id, std::span<const int32_t> tokens, bool is_end);
  Status stop_committing(uint32_t id);
  Status plan_snapshot_drop(uint32_t id);
  Status release_planned_drops(uint32_t id);
  void clear_reusable_blocks();
  void on_page_dropped(PageId page);
  void on_page_moved(PageId page);
  std::string check_tree() const;

 private:
  std::string label(uint32_t id) const;
  Status expect_state(uint32_t id, CacheState want, const char* op) const;
  Status check_group(uint32_t id, CacheGroupId group, uint32_t beam) const;
  // Visits every distinct page of a cache once.
  template <typename Fn>
  void for_each_page(const CacheRecord& rec, Fn&& fn) const;
  // Is block b of an attention group live at (capacity, history)?
  bool block_needed(const CacheGroup& group, uint64_t block, uint64_t capacity,
                    uint64_t history) const;
  // Fresh pages per pool group that (capacity, history) needs beyond what the cache holds.
  // Only blocks from `from_block` on are looked at.
  std::vector<uint64_t> new_pages_needed(const CacheRecord& rec, uint64_t capacity,
                                         uint64_t history, uint64_t from_block) const;
  // Allocates those pages on the GPU (room already made) with an active ref.
  void allocate_pages(CacheRecord& rec, uint64_t capacity, uint64_t history, uint64_t from_block);
  // Block-table (and index-buffer) entries [from, to) of an attention group, every beam.
  void set_table_entries(CacheRecord& rec, const CacheGroup& g, uint64_t from, uint64_t to);
  Status check_room(const char* op, const std::vector<uint64_t>& need,
                    const storage::Exclusions& excluded) const;
  void rebuild_tables(CacheRecord& rec);
  void write_index_buffers(CacheRecord& rec);
  int32_t priority_of(const CacheRecord& rec, uint64_t block) const;
  // Reuse helpers (reuse.cc).
  void attach_match(CacheRecord& rec, const MatchPlan& plan);
  Status prepare_first_resume(uint32_t id, const std::vector<CacheGroupId>* optional_groups);
  void finish_first_resume(CacheRecord& rec);
  void record_match_stats(const CacheRecord& rec, bool optional_only);
  void emit(CacheEventKind kind, prefix::NodeId node, CacheGroupId group);
  void publish(prefix::NodeId node, CacheGroupId group, PageId page, uint32_t coverage);
  void unpublish(prefix::NodeId node, CacheGroupId group);
};

}  // namespace hybridkv::cache_detail
