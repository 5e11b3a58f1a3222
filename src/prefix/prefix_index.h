// PrefixIndex: what requests can share (DESIGN §6). It owns the radix tree of committed blocks,
// the block-key hasher, the reuse statistics and the tree events; it matches prompts against the
// tree with hybrid pruning, takes pages offered by commits (deduplicating against blocks already
// there), keeps snapshots, runs planned drops and checks its own consistency.
//
// Pages: the index is the owner (storage::Storage::set_owner, tag = node id) of every page it
// keeps, one per (node, cache group); the eviction loop (storage/room.h) tells it, as the
// storage::PageOwner, when such a page is about to be dropped or has changed tier or priority. It
// never touches a cache's references: the per-request state machine (cache/) does, from what the
// index returns.
//
// Thread-safety: none of its own; the manager's lock covers it. match() only reads the tree and
// the given hasher, so probes may run it concurrently under a shared lock.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hybridkv/reuse.h"
#include "prefix/block_hash.h"
#include "prefix/radix_tree.h"
#include "storage/room.h"
#include "storage/storage.h"

namespace hybridkv::prefix {

// What a match found, with the nodes behind it.
struct MatchPlan {
  ReuseMatch match;
  NodeId root = kNoNode;
  std::vector<NodeId> path;  // full nodes of blocks 0, 1, ...
  NodeId tail = kNoNode;     // node of the partially used last block, if any
  uint64_t tail_tokens = 0;  // tokens of the tail node matched
  // What the match reuses, per cache group (match_and_mark_demand fills it; probes do not):
  // an attention group's tree page of each block [0, ceil(reused / tokens_per_block)), an SSM
  // group's snapshot at the reused tokens (one entry); kNoPage where the tree has none, and
  // nothing for PRIVATE groups or an empty match.
  std::vector<std::vector<storage::PageId>> pages;
};

// What became of a page a commit offered for a block.
enum class OfferResult : uint8_t {
  kPublished,  // the index keeps the offered page
  kAdopt,      // the block already holds an equal page on the GPU: use it, free your own
  kKept,       // the block already holds a page the cache cannot use; keep your own
};
struct Offer {
  OfferResult result = OfferResult::kKept;
  storage::PageId tree_page;  // kAdopt: the page to use instead
};

class PrefixIndex final : public storage::PageOwner {
 public:
  PrefixIndex(const StoragePlan& plan, storage::Storage& storage);
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // --- matching (match.cc) ---
  // What the tree can restore of `tokens`. Reads only (the hasher is the caller's).
  // `keys`: the keys of the prompt's first full blocks, computed ahead (prompt_block_keys);
  // blocks past them are hashed here.
  MatchPlan match(BlockHasher& hasher, const ReuseScope& scope, std::span<const int32_t> tokens,
                  std::span<const MultimodalItem> multimodal,
                  std::span<const BlockKey> keys = {}) const;
  // match() with the index's own hasher and the pages it reuses (MatchPlan::pages); then marks
  // the block end where attention reached past the last snapshot, so that requests passing it
  // (this one first) take a snapshot there.
  MatchPlan match_and_mark_demand(const ReuseScope& scope, std::span<const int32_t> tokens,
                                  std::span<const MultimodalItem> multimodal,
                                  std::span<const BlockKey> keys = {});
  // match(), then every tree page the match would reuse becomes the most recent in its
  // eviction queue (storage::Storage::touch), deepest block first as a release queues them.
  // Counts nothing and takes no reference.
  ReuseMatch touch_reuse(const ReuseScope& scope, std::span<const int32_t> tokens,
                         std::span<const MultimodalItem> multimodal,
                         std::span<const BlockKey> keys = {});
  // Counts a lookup for `groups` (and reused pages served per tier).
  void record_lookup(const ReuseMatch& match, std::span<const CacheGroupId> groups);
  // A cache took these pages of a match (once per reference).
  void record_served(std::span<const storage::PageId> pages);

 private:
  // The tree page of `group` for `block` of a match (the tail node past the path), or kNoPage.
  storage::PageId matched_page(const MatchPlan& mp, CacheGroupId group, uint64_t block) const;
  // The SSM snapshot of `group` exactly at the match's reused tokens, or kNoPage.
  storage::PageId matched_snapshot(const MatchPlan& mp, CacheGroupId group) const;
  void fill_reused_pages(MatchPlan& mp) const;

 public:
  // --- commits ---
  // The root of a scope (pinned for as long as it lives).
  NodeId root(const ReuseScope& scope);
  // The node of the block [begin, begin + tokens.size()) under `parent`, created if new;
  // full: tokens_per_block tokens, else a partial leaf (never rebased).
  NodeId block_node(NodeId parent, std::span<const int32_t> tokens, uint64_t begin,
                    std::span<const MultimodalItem> multimodal, bool full);
  // The same with the block's key known (prompt_block_keys): nothing is hashed.
  NodeId block_node_keyed(NodeId parent, const BlockKey& key, std::span<const int32_t> tokens,
                          bool full);
  // Whether the node's KV pages were sent to the shared tier; marks them sent.
  bool shared(NodeId node) const { return tree_.node(node).shared; }
  void mark_shared(NodeId node) { tree_.node(node).shared = true; }
  // The node of a block key, or kNoNode.
  NodeId find(const BlockKey& key) const { return tree_.find(key); }
  // Offers a cache's page for a block (deduplication: see OfferResult).
  Offer offer(NodeId node, CacheGroupId group, storage::PageId own, uint32_t coverage);
  // The index keeps `page` for (node, group). Requires: the node holds no page of the group.
  // `speculative`: an SSM snapshot published as SnapshotRole::kSpeculative.
  void publish(NodeId node, CacheGroupId group, storage::PageId page, uint32_t coverage,
               bool speculative = false);
  bool holds(NodeId node, CacheGroupId group) const;
  // A cache commits under `node`: it stays while pinned; unpin prunes it when it became empty.
  void pin(NodeId node);
  void unpin(NodeId node);
  // An ACTIVE cache commits under `node` and holds every page on its path: while it does, the
  // path counts as resumable (worth.cc), so that dropping the request's newest speculative
  // snapshot does not demote its whole path for the next commit to promote again. Verdicts are
  // unchanged where they are read: only a page no ACTIVE cache holds is queued or moved, and
  // none of those is on a held path. hold_resumable returns false (and holds nothing) where
  // that does not hold: no resume group, or an attention group that lets go of blocks (a
  // window) or may not hold them (OPTIONAL).
  bool hold_resumable(NodeId node);
  void release_resumable(NodeId node);
  // The partial leaf under `parent` that ends at `end`, or kNoNode.
  NodeId partial_child(NodeId parent, uint64_t end) const;
  uint32_t node_tokens(NodeId node) const;

  // --- planned drops (reference-counted per (node, group)) ---
  // The SSM snapshots at `node` and, per window group, every page of the window that a match
  // ending at `node` needs (sink blocks excepted): each (node, group) planned is counted and
  // pinned until release_drop.
  std::vector<std::pair<NodeId, CacheGroupId>> plan_drop(NodeId node);
  void release_drop(NodeId node, CacheGroupId group);

  // --- upkeep and reporting ---
  // A snapshot dropped to make room (page_dropping) implies three walks up its node's path: the
  // carry that demotes the KV run it served, the promotion of the snapshot it superseded and
  // the pruning of the emptied nodes. Each is as long as the path (65-76 us a drop with
  // 32-token pages on the conversation trace), so they wait for tidy(), which the manager runs
  // between steps (MemoryControl::evict_ahead), with PolicyConfig::upkeep_between_steps
  // (without it, in the drop). Meanwhile the node stays, pinned, with its
  // share of Node::resumable kept as an untidy drop (Node::untidy_drops): the run above counts
  // as resumable until then, as it did before the drop. At most kMaxUntidy drops wait: the
  // oldest is tidied when one more comes.
  // Tidies up to `most` of the waiting drops, oldest first; returns how many.
  size_t tidy(size_t most = SIZE_MAX);
  size_t untidy() const { return untidy_.size(); }
  static constexpr size_t kMaxUntidy = 64;
  // Unlinks every page (pages held by caches stay with them).
  void clear();
  ReuseStats stats() const;
  // stats(), then the counters start again from zero (tree_blocks is a level, not a counter).
  ReuseStats take_stats();
  std::vector<CacheEvent> take_events();
  const RadixTree& tree() const { return tree_; }
  // Every node is indexed by its key and holds pages that point back to it; coverage never
  // exceeds the block; no PRIVATE page is kept. Empty string = fine.
  std::string check() const;
  std::string snapshot() const;

  void page_dropping(storage::PageId page, storage::OwnerTag owner, CacheGroupId group) override;
  void pages_updated(std::span<const storage::PageNotice> notices) override;

 private:
  // --- snapshot-aware eviction (worth.cc) ---
  static std::optional<CacheGroupId> find_resume_group(const StoragePlan& plan);
  static bool caches_hold_paths(const StoragePlan& plan);
  void note_published(NodeId node, CacheGroupId group, storage::PageId page, bool speculative);
  void note_unpublished(NodeId node, CacheGroupId group, bool speculative);
  void note_served(storage::PageId page);
  static double snapshot_tokens(const StoragePlan& plan, CacheGroupId group);
  void price_snapshot(NodeId node, storage::PageId page);
  float continuation_prior(NodeId node) const;
  void age_kv_above(NodeId node, uint8_t age_class);
  // Resumes a snapshot's price counts at most: served once, a snapshot is worth twice an
  // unserved one; more resumes say little more (measured, bench/RESULTS.md 2026-12-01).
  static constexpr double kMaxPricedHits = 2;
  // Adds `delta` to the node's count (Node::resumable or Node::kv_below) and carries each change
  // between zero and non-zero to its parent; `crossed(node, nonzero)` runs for each node whose
  // count crossed.
  template <typename Crossed>
  void carry_count(NodeId id, int delta, uint32_t Node::*count, Crossed&& crossed);
  void count_resumable(NodeId id, int delta);
  void count_kv(NodeId id, int delta);  // Node::kv_below
  NodeId superseded_by(NodeId id) const;
  void mark_superseded(NodeId id, bool demoted);
  void drop_orphaned_kv(NodeId node, CacheGroupId group);
  // Node::resumable and Node::kv_below against a count from scratch. Empty string = fine.
  std::string check_counts() const;

  void emit(CacheEventKind kind, NodeId node, CacheGroupId group);
  void push_event(CacheEvent e, NodeId node, CacheGroupId group);
  void note_removed(NodeId node, CacheGroupId group);  // snapshot statistics and marks
  // The tree lets go of the node's page of `group` (events, statistics, worth); the caller
  // tells storage and prunes.
  void forget(NodeId node, CacheGroupId group);
  void unpublish(NodeId node, CacheGroupId group);
  // page_dropping's way for a snapshot of the resume group (see tidy).
  void defer_snapshot_drop(NodeId node, CacheGroupId group);

  const StoragePlan& plan_;
  storage::Storage& storage_;
  // The SSM group a request resumes from (snapshot-aware eviction is off without one).
  std::optional<CacheGroupId> resume_group_;
  double snapshot_tokens_ = 0;  // tokens of KV one snapshot's bytes would hold
  bool prices_ = false;         // the eviction policy reads snapshot prices (price_snapshot)
  bool path_holds_ = false;     // hold_resumable takes holds
  size_t max_untidy_ = 0;       // kMaxUntidy with upkeep between steps, else 0
  RadixTree tree_;
  BlockHasher hasher_;
  ReuseStats stats_;
  std::vector<CacheEvent> events_;
  // drop_orphaned_kv's buffers, kept between calls.
  std::vector<std::pair<NodeId, CacheGroupId>> orphans_;
  std::vector<NodeId> orphan_walk_;
  struct Untidy {
    NodeId node;
    bool speculative = false;
  };
  std::deque<Untidy> untidy_;  // drops waiting for tidy(), oldest first
};

// Digests of the multimodal items starting in [begin, end), into `buffer`; no allocation and an
// empty span without items.
std::span<const std::array<uint8_t, 32>> digests_between(
    std::span<const MultimodalItem> items, uint64_t begin, uint64_t end,
    std::vector<std::array<uint8_t, 32>>& buffer);

// The keys of every full block of `tokens` under `scope`, chained from the scope's root: what
// match() and block_node() would compute, block by block.
std::vector<BlockKey> prompt_block_keys(BlockHasher& hasher, const ReuseScope& scope,
                                        std::span<const int32_t> tokens,
                                        std::span<const MultimodalItem> multimodal,
                                        uint32_t tokens_per_block);

}  // namespace hybridkv::prefix
