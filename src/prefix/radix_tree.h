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

#include <unordered_map>
#include <vector>

#include "prefix/block_hash.h"
#include "storage/page.h"

namespace hybridkv::prefix {

using NodeId = uint32_t;
inline constexpr NodeId kNoNode = UINT32_MAX;

struct NodePage {
  storage::PageId page = storage::kNoPage;
  uint32_t coverage = 0;       // tokens of the node valid in the page
  uint32_t planned_drops = 0;  // caches that plan to release this snapshot / window page
};

struct Node {
  BlockKey key{};
  NodeId parent = kNoNode;
  uint64_t start = 0;           // token position of the block's first token
  std::vector<int32_t> tokens;  // the block's tokens (empty for a root)
  bool full = false;            // tokens_per_block tokens (roots count as full)
  bool live = false;
  std::vector<NodePage> pages;   // by cache group id
  std::vector<NodeId> children;  // full and partial
  uint32_t pins = 0;             // roots, and caches committing under this node

  uint64_t end() const { return start + tokens.size(); }
  bool empty() const {
    for (const NodePage& p : pages) {
      if (p.page != storage::kNoPage) return false;
    }
    return true;
  }
};

class RadixTree {
 public:
  explicit RadixTree(size_t num_groups) : num_groups_(num_groups) {}

  NodeId find(const BlockKey& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? kNoNode : it->second;
  }
  // The root of a scope (created and pinned on first use).
  NodeId root(const BlockKey& key);
  // A new child. Requires: no node with `key`.
  NodeId add(NodeId parent, const BlockKey& key, std::span<const int32_t> tokens, bool full);
  // Removes `id` and then its ancestors while they are empty, childless and unpinned.
  void prune(NodeId id);

  Node& node(NodeId id) { return nodes_[id]; }
  const Node& node(NodeId id) const { return nodes_[id]; }
  size_t capacity() const { return nodes_.size(); }
  size_t size() const { return index_.size(); }

 private:
  size_t num_groups_;
  std::vector<Node> nodes_;
  std::vector<NodeId> free_;
  std::unordered_map<BlockKey, NodeId, BlockKeyHash> index_;
};

}  // namespace hybridkv::prefix
