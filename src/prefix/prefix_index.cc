#include "prefix/prefix_index.h"

#include <algorithm>
#include <sstream>

#include "util/blocks.h"
#include "util/check.h"

namespace hybridkv::prefix {

using storage::kNoPage;
using storage::PageId;

std::span<const std::array<uint8_t, 32>> digests_between(
    std::span<const MultimodalItem> items, uint64_t begin, uint64_t end,
    std::vector<std::array<uint8_t, 32>>& buffer) {
  if (items.empty()) return {};
  buffer.clear();
  for (const MultimodalItem& item : items) {
    if (item.position >= begin && item.position < end) buffer.push_back(item.digest);
  }
  return buffer;
}

PrefixIndex::PrefixIndex(const StoragePlan& plan, storage::Storage& storage)
    : plan_(plan),
      storage_(storage),
      resume_group_(find_resume_group(plan)),
      snapshot_tokens_(resume_group_ ? snapshot_tokens(plan, *resume_group_) : 0),
      prices_(
          storage::find_eviction_policy(plan.config().policies.eviction).value()->uses_prices()),
      path_holds_(resume_group_ && caches_hold_paths(plan)),
      max_untidy_(resume_group_ && plan.config().policies.upkeep_between_steps ? kMaxUntidy : 0),
      tree_(plan.cache_groups().size()),
      hasher_(plan.config().block_hash) {
  stats_.groups.resize(plan.cache_groups().size());
}

PageId PrefixIndex::matched_page(const MatchPlan& mp, CacheGroupId group, uint64_t block) const {
  if (block < mp.path.size()) return tree_.pages(mp.path[block])[group.value].page;
  if (block == mp.path.size() && mp.tail != kNoNode) return tree_.pages(mp.tail)[group.value].page;
  return kNoPage;
}

PageId PrefixIndex::matched_snapshot(const MatchPlan& mp, CacheGroupId group) const {
  const uint32_t tpb = plan_.config().tokens_per_block;
  const uint64_t reused = mp.match.reused_tokens;
  NodeId at = kNoNode;
  if (mp.tail != kNoNode && mp.path.size() * tpb + mp.tail_tokens == reused)
    at = mp.tail;
  else if (reused > 0 && reused % tpb == 0 && reused / tpb <= mp.path.size())
    at = mp.path[reused / tpb - 1];
  return at == kNoNode ? kNoPage : tree_.pages(at)[group.value].page;
}

void PrefixIndex::record_lookup(const ReuseMatch& m, std::span<const CacheGroupId> groups) {
  if (m.lookup_tokens == 0) return;
  const uint64_t reused = m.reused_tokens;
  for (CacheGroupId g : groups) {
    GroupReuseStats& s = stats_.groups[g.value];
    ++s.lookups;
    ++(reused > 0 ? s.hits : s.misses);
    s.reused_tokens += reused;
    s.unreused_tokens += m.lookup_tokens - reused;
    if (plan_.cache_group(g).kind == GroupKind::kSsm && reused > 0) {
      ++(reused % plan_.config().tokens_per_block == 0 ? s.aligned_snapshot_hits
                                                       : s.unaligned_snapshot_hits);
    }
  }
}

void PrefixIndex::record_served(std::span<const PageId> pages) {
  for (PageId page : pages) {
    const storage::Page& p = storage_.page(page);
    ++stats_.pages_served_by_tier[static_cast<size_t>(p.tier)];
    ++stats_.groups[p.group.value].served_by_tier[static_cast<size_t>(p.tier)];
    note_served(page);
  }
}

void PrefixIndex::fill_reused_pages(MatchPlan& mp) const {
  const uint64_t reused = mp.match.reused_tokens;
  mp.pages.assign(plan_.cache_groups().size(), {});
  if (reused == 0) return;
  const uint64_t blocks = blocks_for(reused, plan_.config().tokens_per_block);
  for (const CacheGroup& g : plan_.cache_groups()) {
    std::vector<PageId>& out = mp.pages[g.id.value];
    if (g.policy == ReusePolicy::kPrivate) continue;
    if (g.kind == GroupKind::kSsm) {
      out.push_back(matched_snapshot(mp, g.id));
      continue;
    }
    out.reserve(blocks);
    for (uint64_t b = 0; b < blocks; ++b) out.push_back(matched_page(mp, g.id, b));
  }
}

NodeId PrefixIndex::root(const ReuseScope& scope) { return tree_.root(hasher_.root(scope)); }

NodeId PrefixIndex::block_node(NodeId parent, std::span<const int32_t> tokens, uint64_t begin,
                               std::span<const MultimodalItem> multimodal, bool full) {
  std::vector<std::array<uint8_t, 32>> buffer;
  const BlockKey key =
      hasher_.key(tree_.node(parent).key, tokens,
                  digests_between(multimodal, begin, begin + tokens.size(), buffer));
  return block_node_keyed(parent, key, tokens, full);
}

NodeId PrefixIndex::block_node_keyed(NodeId parent, const BlockKey& key,
                                     std::span<const int32_t> tokens, bool full) {
  const NodeId node = tree_.find(key);
  return node != kNoNode ? node : tree_.add(parent, key, tokens, full);
}

std::vector<BlockKey> prompt_block_keys(BlockHasher& hasher, const ReuseScope& scope,
                                        std::span<const int32_t> tokens,
                                        std::span<const MultimodalItem> multimodal,
                                        uint32_t tokens_per_block) {
  std::vector<BlockKey> keys(tokens.size() / tokens_per_block);
  std::vector<std::array<uint8_t, 32>> buffer;
  BlockKey chain = hasher.root(scope);
  for (size_t b = 0; b < keys.size(); ++b) {
    const uint64_t at = b * tokens_per_block;
    chain = keys[b] = hasher.key(chain, tokens.subspan(at, tokens_per_block),
                                 digests_between(multimodal, at, at + tokens_per_block, buffer));
  }
  return keys;
}

Offer PrefixIndex::offer(NodeId node, CacheGroupId group, PageId own, uint32_t coverage) {
  const NodePage& np = tree_.pages(node)[group.value];
  if (np.page == kNoPage) {
    publish(node, group, own, coverage);
    return {OfferResult::kPublished, own};
  }
  // Same key, same tokens, same bytes: the cache may use the tree's page when it is complete
  // and on the GPU (an ACTIVE cache's pages are).
  if (np.page != own && np.coverage == coverage && storage_.page(np.page).tier == TierKind::kGpu) {
    return {OfferResult::kAdopt, np.page};
  }
  return {OfferResult::kKept, kNoPage};
}

void PrefixIndex::publish(NodeId node, CacheGroupId group, PageId page, uint32_t coverage,
                          bool speculative) {
  NodePage& np = tree_.pages(node)[group.value];
  HKV_CHECK(np.page == kNoPage, "publishing over an existing tree page");
  HKV_CHECK(plan_.cache_group(group).policy != ReusePolicy::kPrivate,
            "a PRIVATE page cannot be published");
  np.page = page;
  np.coverage = coverage;
  storage_.set_owner(page, node.value);
  if (plan_.cache_group(group).kind == GroupKind::kSsm) {
    ++stats_.groups[group.value].snapshots_stored;
    tree_.node(node).snapshot_dropped = false;
  }
  note_published(node, group, page, speculative);
  emit(CacheEventKind::kStored, node, group);
}

bool PrefixIndex::holds(NodeId node, CacheGroupId group) const {
  return tree_.pages(node)[group.value].page != kNoPage;
}

void PrefixIndex::pin(NodeId node) { ++tree_.node(node).pins; }

void PrefixIndex::unpin(NodeId node) {
  HKV_CHECK(tree_.node(node).pins > 0, "unpin of an unpinned tree node");
  --tree_.node(node).pins;
  tree_.prune(node);
}

NodeId PrefixIndex::partial_child(NodeId parent, uint64_t end) const {
  if (parent == kNoNode) return kNoNode;
  const Node& n = tree_.node(parent);
  const uint32_t tpb = plan_.config().tokens_per_block;
  for (size_t i = 0; i < n.children.size(); ++i) {
    if (n.heads[i].tokens < tpb && n.end() + n.heads[i].tokens == end) return n.children[i];
  }
  return kNoNode;
}

uint32_t PrefixIndex::node_tokens(NodeId node) const {
  return static_cast<uint32_t>(tree_.node(node).tokens.size());
}

std::vector<std::pair<NodeId, CacheGroupId>> PrefixIndex::plan_drop(NodeId node) {
  std::vector<std::pair<NodeId, CacheGroupId>> planned;
  auto plan_one = [&](NodeId n, CacheGroupId g) {
    NodePage& np = tree_.pages(n)[g.value];
    if (np.page == kNoPage) return;
    ++np.planned_drops;
    ++tree_.node(n).pins;  // the node stays until the plan runs
    planned.push_back({n, g});
  };
  const uint32_t tpb = plan_.config().tokens_per_block;
  const uint64_t end = tree_.node(node).end();
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kSsm) plan_one(node, g.id);
    if (!g.window) continue;
    // The blocks a step from `end` reads: from the window's first live block on.
    const uint64_t first = std::max<uint64_t>(g.first_live_block(end, tpb), g.sink_blocks);
    for (NodeId n = node; n != kNoNode && !tree_.node(n).tokens.empty(); n = tree_.node(n).parent) {
      if (tree_.node(n).start / tpb < first) break;
      plan_one(n, g.id);
    }
  }
  return planned;
}

void PrefixIndex::release_drop(NodeId node, CacheGroupId group) {
  NodePage& np = tree_.pages(node)[group.value];
  --tree_.node(node).pins;
  if (np.page != kNoPage && np.planned_drops > 0 && --np.planned_drops == 0) {
    unpublish(node, group);
  } else {
    tree_.prune(node);
  }
}

void PrefixIndex::clear() {
  tidy();
  for (uint32_t i = 0; i < tree_.capacity(); ++i) {
    for (const CacheGroup& g : plan_.cache_groups()) {
      if (tree_.node(NodeId(i)).live) unpublish(NodeId(i), g.id);
    }
  }
}

ReuseStats PrefixIndex::stats() const {
  ReuseStats out = stats_;
  out.tree_blocks = tree_.size();
  return out;
}

void PrefixIndex::note_removed(NodeId node, CacheGroupId group) {
  if (plan_.cache_group(group).kind != GroupKind::kSsm) return;
  ++stats_.groups[group.value].snapshots_removed;
  tree_.node(node).snapshot_dropped = true;
}

ReuseStats PrefixIndex::take_stats() {
  ReuseStats out = stats();
  for (GroupReuseStats& g : stats_.groups) g = GroupReuseStats{};
  stats_.pages_served_by_tier = {};
  return out;
}

std::vector<CacheEvent> PrefixIndex::take_events() { return std::exchange(events_, {}); }

void PrefixIndex::emit(CacheEventKind kind, NodeId node, CacheGroupId group) {
  if (!plan_.config().record_events) return;
  CacheEvent e;
  e.kind = kind;
  const PageId pid = tree_.pages(node)[group.value].page;
  if (pid != kNoPage) {
    e.tier = storage_.page(pid).tier;
    e.priority = storage_.page(pid).priority;
  }
  push_event(std::move(e), node, group);
}

// Completes an event of (node, group) with the node's keys (and tokens when stored).
void PrefixIndex::push_event(CacheEvent e, NodeId node, CacheGroupId group) {
  const Node& n = tree_.node(node);
  e.key = n.key;
  if (n.parent != kNoNode) e.parent_key = tree_.node(n.parent).key;
  if (e.kind == CacheEventKind::kStored) e.tokens = n.tokens;
  e.group = group;
  events_.push_back(std::move(e));
}

void PrefixIndex::forget(NodeId node, CacheGroupId group) {
  emit(CacheEventKind::kRemoved, node, group);
  note_removed(node, group);
  const bool speculative = tree_.pages(node)[group.value].speculative;
  tree_.pages(node)[group.value] = NodePage{};
  note_unpublished(node, group, speculative);
}

void PrefixIndex::unpublish(NodeId node, CacheGroupId group) {
  const PageId pid = tree_.pages(node)[group.value].page;
  if (pid == kNoPage) return;
  forget(node, group);
  storage_.clear_owner(pid);
  tree_.prune(node);
}

void PrefixIndex::page_dropping(PageId page, storage::OwnerTag owner, CacheGroupId group) {
  const NodeId node(owner);
  HKV_CHECK(tree_.pages(node)[group.value].page == page, "dropped page %u is not in the tree",
            page.value);
  if (max_untidy_ > 0 && group == *resume_group_) return defer_snapshot_drop(node, group);
  forget(node, group);
  drop_orphaned_kv(node, group);
  tree_.prune(node);
}

// forget() without its walks: the page's share of the node's resumable count stays, as an
// untidy drop.
void PrefixIndex::defer_snapshot_drop(NodeId node, CacheGroupId group) {
  if (untidy() >= max_untidy_) tidy(1);
  emit(CacheEventKind::kRemoved, node, group);
  note_removed(node, group);
  NodePage& np = tree_.pages(node)[group.value];
  untidy_.push_back({node, np.speculative});
  np = NodePage{};
  Node& n = tree_.node(node);
  ++n.untidy_drops;
  ++n.pins;
}

size_t PrefixIndex::tidy(size_t most) {
  size_t done = 0;
  for (; done < most && !untidy_.empty(); ++done) {
    const Untidy u = untidy_.front();
    untidy_.pop_front();
    Node& n = tree_.node(u.node);
    --n.untidy_drops;
    count_resumable(u.node, -1);
    // A snapshot published at the node since keeps superseding the one above.
    const NodePage& np = tree_.pages(u.node)[resume_group_->value];
    if (!u.speculative && (np.page == kNoPage || np.speculative)) mark_superseded(u.node, false);
    unpin(u.node);
  }
  return done;
}

void PrefixIndex::pages_updated(std::span<const storage::PageNotice> notices) {
  if (!plan_.config().record_events) return;
  for (const storage::PageNotice& n : notices) {
    CacheEvent e;
    e.kind = CacheEventKind::kUpdated;
    e.tier = n.tier;
    e.priority = n.priority;
    push_event(std::move(e), NodeId(n.owner), n.group);
  }
}

std::string PrefixIndex::check() const {
  std::string err;
  const uint32_t tpb = plan_.config().tokens_per_block;
  tree_.for_each_node([&](NodeId id, const Node& n) {
    if (!err.empty()) return;
    const std::string name = "tree node " + std::to_string(id.value);
    if (tree_.find(n.key) != id) err = name + " is not indexed by its key";
    if (n.parent != kNoNode && n.start != tree_.node(n.parent).end()) err = name + ": start is off";
    if (n.parent != kNoNode) {
      const std::vector<NodeId>& kids = tree_.node(n.parent).children;
      const std::vector<ChildHead>& heads = tree_.node(n.parent).heads;
      if (n.child_pos >= kids.size() || kids[n.child_pos] != id)
        err = name + " is not at its place among its parent's children";
      else if (heads.size() != kids.size() || heads[n.child_pos] != ChildHead::of(n.tokens))
        err = name + ": its parent's record of its first token and size is off";
    }
    if (n.tokens.size() > tpb || (n.full && n.parent != kNoNode && n.tokens.size() != tpb))
      err = name + " has a wrong token count";
    for (const CacheGroup& g : plan_.cache_groups()) {
      const NodePage& np = tree_.pages(id)[g.id.value];
      if (np.page == kNoPage) continue;
      const storage::Page& p = storage_.page(np.page);
      if (!p.live || p.owner != id.value || p.group != g.id)
        err = name + " group " + std::to_string(g.id.value) + " holds a page not owned by it";
      if (np.coverage > n.tokens.size()) err = name + ": page coverage exceeds its block";
      if (g.policy == ReusePolicy::kPrivate) err = name + ": a PRIVATE page is in the tree";
    }
  });
  if (!err.empty()) return err;
  if (resume_group_) err = check_counts();
  if (!err.empty()) return err;
  for (uint32_t i = 0; i < storage_.page_capacity(); ++i) {
    const storage::Page& p = storage_.page(PageId(i));
    if (!p.live || !p.owned()) continue;
    const NodeId node(p.owner);
    if (node.value >= tree_.capacity() || !tree_.node(node).live ||
        tree_.pages(node)[p.group.value].page != PageId(i)) {
      return "page " + std::to_string(i) + " is owned by the tree but no node holds it";
    }
  }
  return "";
}

std::string PrefixIndex::snapshot() const {
  std::ostringstream os;
  tree_.for_each_node([&](NodeId id, const Node& node) {
    os << "node " << id.value << " start " << node.start << " tokens " << node.tokens.size()
       << " pins " << node.pins;
    for (const NodePage& np : tree_.pages(id)) {
      os << " " << static_cast<int64_t>(np.page == kNoPage ? -1 : np.page.value) << "/"
         << np.coverage;
    }
    os << "\n";
  });
  return os.str();
}

}  // namespace hybridkv::prefix
