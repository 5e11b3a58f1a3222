#include "prefix/radix_tree.h"

#include <algorithm>

#include "util/check.h"

namespace hybridkv::prefix {

NodeId RadixTree::root(const BlockKey& key) {
  NodeId id = find(key);
  if (id != kNoNode) return id;
  id = add(kNoNode, key, {}, true);
  nodes_[id].pins = 1;  // roots live forever
  return id;
}

NodeId RadixTree::add(NodeId parent, const BlockKey& key, std::span<const int32_t> tokens,
                      bool full) {
  HKV_CHECK(find(key) == kNoNode, "tree key added twice");
  NodeId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[id];
  n = Node{};
  n.key = key;
  n.parent = parent;
  n.start = parent == kNoNode ? 0 : nodes_[parent].end();
  n.tokens.assign(tokens.begin(), tokens.end());
  n.full = full;
  n.live = true;
  n.pages.assign(num_groups_, NodePage{});
  if (parent != kNoNode) {
    HKV_CHECK(nodes_[parent].full, "a partial block cannot have children");
    nodes_[parent].children.push_back(id);
  }
  index_.emplace(key, id);
  return id;
}

void RadixTree::prune(NodeId id) {
  while (id != kNoNode) {
    Node& n = nodes_[id];
    if (!n.live || !n.empty() || !n.children.empty() || n.pins > 0) return;
    const NodeId parent = n.parent;
    if (parent != kNoNode) {
      std::vector<NodeId>& kids = nodes_[parent].children;
      kids.erase(std::find(kids.begin(), kids.end(), id));
    }
    index_.erase(n.key);
    n.live = false;
    n.tokens.clear();
    n.tokens.shrink_to_fit();
    n.children.clear();
    free_.push_back(id);
    id = parent;
  }
}

}  // namespace hybridkv::prefix
