#include "prefix/radix_tree.h"

#include <algorithm>

#include "util/check.h"

namespace hybridkv::prefix {

bool RadixTree::empty(NodeId id) const {
  for (const NodePage& p : pages(id)) {
    if (p.page != storage::kNoPage) return false;
  }
  return true;
}

NodeId RadixTree::root(const BlockKey& key) {
  NodeId id = find(key);
  if (id != kNoNode) return id;
  id = add(kNoNode, key, {}, true);
  node(id).pins = 1;  // roots live forever
  return id;
}

NodeId RadixTree::add(NodeId parent, const BlockKey& key, std::span<const int32_t> tokens,
                      bool full) {
  HKV_CHECK(find(key) == kNoNode, "tree key added twice");
  // A freed node keeps its vectors' capacity (prune), so a reused id allocates nothing.
  NodeId id;
  if (free_.empty()) {
    id = NodeId(static_cast<uint32_t>(nodes_.size()));
    nodes_.add_row();
    pages_.add_row();
  } else {
    id = free_.back();
    free_.pop_back();
  }
  Node& n = node(id);
  n.key = key;
  n.parent = parent;
  n.start = parent == kNoNode ? 0 : node(parent).end();
  n.tokens.assign(tokens.begin(), tokens.end());
  n.full = full;
  n.live = true;
  n.demanded = false;
  n.snapshot_dropped = false;
  n.shared = false;
  n.resumable = 0;
  n.resumable_holds = 0;
  n.untidy_drops = 0;
  n.kv_below = 0;
  for (NodePage& p : pages(id)) p = NodePage{};
  if (parent != kNoNode) {
    HKV_CHECK(node(parent).full, "a partial block cannot have children");
    n.child_pos = static_cast<uint32_t>(node(parent).children.size());
    node(parent).children.push_back(id);
    node(parent).heads.push_back(ChildHead::of(tokens));
  }
  index_.insert(key, id);
  return id;
}

void RadixTree::prune(NodeId id) {
  while (id != kNoNode) {
    Node& n = node(id);
    if (!n.live || !empty(id) || !n.children.empty() || n.pins > 0) return;
    const NodeId parent = n.parent;
    if (parent != kNoNode) {  // the last child takes the hole
      Node& up = node(parent);
      const NodeId last = up.children.back();
      up.children[n.child_pos] = last;
      up.heads[n.child_pos] = up.heads.back();
      node(last).child_pos = n.child_pos;
      up.children.pop_back();
      up.heads.pop_back();
    }
    index_.erase(n.key);
    n.live = false;
    n.tokens.clear();  // capacity kept for the id's next node (add)
    n.children.clear();
    n.heads.clear();
    free_.push_back(id);
    id = parent;
  }
}

}  // namespace hybridkv::prefix
