// RadixTree: committed blocks of every scope, addressed by key.
//
// A node is one token block: a full block (tokens_per_block tokens) or a partial one (fewer, a
// leaf). Keys chain from the scope's root node, so one index serves every scope. Each node holds
// at most one page per cache group with its coverage (tokens valid in the page; it only grows);
// for an SSM group the page is the recurrent state at the node's end (a snapshot). A node with
// no page in any group, no children and no pins is removed (pruned upwards).
//
// Thread-safety: none; the manager's lock covers it (probes take it shared and only read).
#pragma once

#include <span>
#include <vector>

#include "hybridkv/ids.h"
#include "prefix/block_hash.h"
#include "prefix/key_index.h"
#include "storage/page.h"
#include "util/chunked_rows.h"

namespace hybridkv::prefix {

struct NodePage {
  storage::PageId page = storage::kNoPage;
  uint32_t coverage = 0;       // tokens of the node valid in the page
  uint32_t planned_drops = 0;  // caches that plan to release this snapshot / window page
  bool speculative = false;    // a snapshot published as SnapshotRole::kSpeculative, not yet served
};

// A child as its parent sees it: the first token and the token count of its block, so that a
// scan over a node's children (a match's tail, a partial sibling) reads no child node. A root
// has hundreds of children on a real trace, each a cache miss or two away.
struct ChildHead {
  int32_t first_token = 0;
  uint32_t tokens = 0;

  static ChildHead of(std::span<const int32_t> block) {
    return {block.empty() ? 0 : block[0], static_cast<uint32_t>(block.size())};
  }
  bool operator==(const ChildHead&) const = default;
};

struct Node {
  BlockKey key{};
  NodeId parent = kNoNode;
  uint64_t start = 0;           // token position of the block's first token
  std::vector<int32_t> tokens;  // the block's tokens (empty for a root)
  bool full = false;            // tokens_per_block tokens (roots count as full)
  bool live = false;
  std::vector<NodeId> children;  // full and partial, in no particular order
  std::vector<ChildHead> heads;  // children's heads, parallel to `children`
  uint32_t child_pos = 0;        // this node's index in its parent's children (O(1) prune)
  uint32_t pins = 0;             // roots, and caches committing under this node
  bool demanded = false;         // a lookup wanted an SSM snapshot at this block's end
  // A snapshot of an SSM group left this node (evicted or released) and none came back since:
  // matches report the tokens it would have added (ReuseMatch::dropped_snapshot_tokens).
  bool snapshot_dropped = false;
  // The node's KV pages were sent to the shared tier (cache/shared_io.cc).
  bool shared = false;
  // Snapshot-aware eviction (worth.cc): 1 for a snapshot of the index's resume group at this
  // node, plus 1 per child whose count is not 0. Zero: no request can resume at or below the
  // node, so its KV is worth nothing to a hybrid model.
  uint32_t resumable = 0;
  // Of `resumable`: the ACTIVE caches that commit under this node (PrefixIndex::hold_resumable).
  uint32_t resumable_holds = 0;
  // Of `resumable`: snapshots dropped here whose walks wait for PrefixIndex::tidy.
  uint32_t untidy_drops = 0;
  // The same count for attention pages (worth.cc): 1 per attention page at this node, plus 1
  // per child whose count is not 0. Zero: no KV at or below the node, so a block dropped above
  // it orphans nothing here (drop_orphaned_kv does not walk the subtree).
  uint32_t kv_below = 0;

  uint64_t end() const { return start + tokens.size(); }
};

class RadixTree {
 public:
  explicit RadixTree(size_t num_groups) : pages_(num_groups) {}

  NodeId find(const BlockKey& key) const { return index_.find(key); }
  void prefetch(const BlockKey& key) const { index_.prefetch(key); }
  // The root of a scope (created and pinned on first use).
  NodeId root(const BlockKey& key);
  // A new child. Requires: no node with `key`.
  NodeId add(NodeId parent, const BlockKey& key, std::span<const int32_t> tokens, bool full);
  // Removes `id` and then its ancestors while they are empty, childless and unpinned.
  void prune(NodeId id);

  Node& node(NodeId id) { return nodes_.at(id.value); }
  const Node& node(NodeId id) const { return nodes_.at(id.value); }
  // The node's page per cache group (one row of num_groups pages, for locality).
  std::span<NodePage> pages(NodeId id) { return pages_.row(id.value); }
  std::span<const NodePage> pages(NodeId id) const { return pages_.row(id.value); }
  bool empty(NodeId id) const;
  size_t capacity() const { return nodes_.size(); }
  size_t size() const { return index_.size(); }

 private:
  ChunkedRows<Node> nodes_{1};
  ChunkedRows<NodePage> pages_;  // num_groups_ per node
  std::vector<NodeId> free_;
  // Every live node of the tree in id order (for checks and dumps).
 public:
  template <typename Fn>
  void for_each_node(Fn&& fn) const {
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_.at(i).live) fn(NodeId(i), nodes_.at(i));
    }
  }
  KeyIndex index_;
};

}  // namespace hybridkv::prefix
