#include "prefix/radix_tree.h"

#include <algorithm>

#include "util/check.h"

namespace hybridkv::prefix {

NodeId KeyIndex::find(const BlockKey& key) const {
  if (slots_.empty()) return kNoNode;
  const size_t mask = slots_.size() - 1;
  for (size_t i = home(key);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id == kNoNode) return kNoNode;
    if (s.key == key) return s.id;
  }
}

void KeyIndex::grow() {
  std::vector<Slot, HugePageAllocator<Slot>> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  size_ = 0;
  for (const Slot& s : old) {
    if (s.id != kNoNode) insert(s.key, s.id);
  }
}

void KeyIndex::insert(const BlockKey& key, NodeId id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();  // load factor at most 1/2
  const size_t mask = slots_.size() - 1;
  size_t i = home(key);
  while (slots_[i].id != kNoNode) i = (i + 1) & mask;
  slots_[i] = {key, id};
  ++size_;
}

void KeyIndex::erase(const BlockKey& key) {
  const size_t mask = slots_.size() - 1;
  size_t i = home(key);
  while (!(slots_[i].id != kNoNode && slots_[i].key == key)) i = (i + 1) & mask;
  // Backward-shift deletion: keeps every probe chain unbroken without tombstones.
  for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (slots_[j].id == kNoNode) break;
    const size_t h = home(slots_[j].key);
    // Move slot j into the hole at i if i lies cyclically in [h, j).
    const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
    if (movable) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = Slot{};
  --size_;
}

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
    nodes_.emplace_back();
  } else {
    id = free_.back();
    free_.pop_back();
  }
  if (pages_.size() < nodes_.size() * num_groups_) pages_.resize(nodes_.size() * num_groups_);
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
  n.kv_below = 0;
  for (NodePage& p : pages(id)) p = NodePage{};
  if (parent != kNoNode) {
    HKV_CHECK(node(parent).full, "a partial block cannot have children");
    n.child_pos = static_cast<uint32_t>(node(parent).children.size());
    node(parent).children.push_back(id);
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
      std::vector<NodeId>& kids = node(parent).children;
      const NodeId last = kids.back();
      kids[n.child_pos] = last;
      node(last).child_pos = n.child_pos;
      kids.pop_back();
    }
    index_.erase(n.key);
    n.live = false;
    n.tokens.clear();  // capacity kept for the id's next node (add)
    n.children.clear();
    free_.push_back(id);
    id = parent;
  }
}

}  // namespace hybridkv::prefix
