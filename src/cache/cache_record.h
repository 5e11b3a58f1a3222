// CacheRecord: what the manager keeps per request (the state machine's data, DESIGN §5).
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "hybridkv/kv_cache.h"
#include "prefix/prefix_index.h"
#include "storage/page.h"

namespace hybridkv::cache_detail {

using storage::kNoPage;
using storage::PageId;

// Blocks [begin, end).
struct BlockRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end > begin ? end - begin : 0; }
  bool contains(uint64_t b) const { return b >= begin && b < end; }
};

struct GroupState {
  // Attention: pages[block * beam_width + beam]; SSM: pages[beam]. Blocks below the cache's
  // shared_blocks hold one page in every beam entry. kNoPage: not allocated, or released.
  std::vector<PageId> pages;
  std::vector<std::vector<int32_t>> tables;       // per beam: GPU slots (attention groups)
  std::vector<std::span<int32_t>> index_buffers;  // per beam, caller-owned (may be empty)
  uint64_t stale_from = 0;  // window groups: blocks below this left the window
  // Window groups: pages of blocks that left the window before a commit covered them, HELD
  // (never LOCKED: no kernel reads them) until the commit that publishes them or close
  // (DESIGN §5). held[i] is beam 0's page of block held_begin + i (kNoPage: none).
  std::deque<PageId> held;
  uint64_t held_begin = 0;
  // SWA scratch of the current step (window groups, ACTIVE only): LOCKED pages shared by the
  // group's layers for blocks scratch_blocks, which have no page of their own.
  std::vector<PageId> scratch;
  BlockRange scratch_blocks;
  // SSM groups: the states a kernel writes inside the step (KvCache::reserve_states), by the
  // record's reserved_points: LOCKED, only while ACTIVE (kNoPage once a commit took it).
  std::vector<PageId> reserved;
  // Reuse: the page in the last block (attention) or the state (SSM) is a tree page that the
  // first resume copies into a private page before anything writes it.
  bool copy_pending = false;
  bool selected = true;  // OPTIONAL groups: chosen at the first resume (others: always)
};

struct CacheRecord {
  bool in_use = false;
  std::string label;  // names the cache in errors (CacheOptions::label, else "cache <id>")
  CacheState state = CacheState::kSuspended;
  uint64_t capacity = 0;
  uint64_t history = 0;
  uint32_t beam_width = 1;
  uint64_t shared_blocks = 0;  // blocks wholly inside the prompt: one page for every beam
  ReuseScope scope;
  std::vector<int32_t> tokens;
  uint64_t attention_blocks = 0;  // blocks of every attention group's pages vector
  // The fewest entries of any attention group's index buffer (UINT64_MAX: none set): a resize
  // to at most this many blocks fits every buffer without looking at them.
  uint64_t index_buffer_room = UINT64_MAX;
  std::vector<GroupState> groups;       // by cache group id
  std::vector<int32_t> block_priority;  // explicit priorities by block (default elsewhere)
  CopyEvent ready;
  // Reuse.
  std::vector<MultimodalItem> multimodal;
  ReuseMatch match;  // what create() matched
  bool first_resume_done = false;
  bool committing = true;   // until stop_committing() or an is_end commit
  bool scratch_on = false;  // SWA scratch for this request (CacheOptions::swa_scratch)
  std::vector<uint64_t> reserved_points;  // KvCache::reserve_states, increasing
  uint64_t scratch_boundary = 0;  // capacity - max_rewind_len of the step with scratch (0: none)
  uint64_t committed = 0;         // tokens published (or reused) so far
  // Full node the next block hangs under; pinned while set.
  prefix::NodeId commit_parent = prefix::kNoNode;
  // The deepest node of the commit path whose whole path the cache's rows hold (it stops
  // where the cache kept a page of its own beside the tree's), and the node this ACTIVE cache
  // holds resumable (PrefixIndex::hold_resumable; kNoNode when none).
  prefix::NodeId hold_point = prefix::kNoNode;
  prefix::NodeId resumable_hold = prefix::kNoNode;
  // The prompt's block keys, computed ahead (CacheOptions::prompt_keys): its commits use them.
  std::shared_ptr<const std::vector<BlockKey>> prompt_keys;

  // Distinct pages of an attention block: one shared by every beam inside the prompt's full
  // blocks (beam search forks after the prompt), one per beam after.
  uint32_t beams_at(uint64_t block) const { return block < shared_blocks ? 1 : beam_width; }
  // Entries of an attention block's row that hold beam 0's page.
  uint32_t entries_of_beam0(uint64_t block) const { return block < shared_blocks ? beam_width : 1; }
  PageId* row(CacheGroupId group, uint64_t block) {
    return &groups[group.value].pages[block * beam_width];
  }
  const PageId* row(CacheGroupId group, uint64_t block) const {
    return &groups[group.value].pages[block * beam_width];
  }
  bool active() const { return state == CacheState::kActive; }
  void note_ready(CopyEvent event) {
    if (event.ticket > ready.ticket) ready = event;
  }
};

}  // namespace hybridkv::cache_detail
