// Snapshot-aware eviction (issue 12): what a tree page is worth to a hybrid model.
//
// With a REQUIRED SSM group, a request resumes only at a snapshot, so
//  - a KV block with no snapshot at or below it on any path (past the deepest snapshot) can
//    serve no request: its pages are demoted (evicted before every page that is not, and
//    dropped rather than copied down a tier) until a snapshot appears under it;
//  - dropping the last snapshot under a KV run demotes that run (the counts of Node::resumable
//    fall to zero on the way up);
//  - a full-attention KV block dropped from the tree takes the KV pages below it along
//    (drop_orphaned_kv): no match reaches them until a request computes the block again;
//  - a snapshot superseded by a deeper one on a path that does not fork between them is demoted;
//    it is promoted again when a match resumes from it or the deeper one goes;
//  - a speculative snapshot (SnapshotRole::kSpeculative: a periodic point) is demoted from the
//    start and supersedes nothing; a match that resumes from it makes it an ordinary one;
//  - with an eviction policy that reads prices ("priced"), a snapshot ages as fast as it is cheap:
//  tokens of
//    recompute saved per byte (price_snapshot), and the KV run above it ages with it: the two
//    serve a resume only together;
//  - a snapshot published below one that has served a resume (a conversation that goes on)
//    starts with part of a resume to its credit (continuation_prior).
// Storage owns the queues; the index only tells it each page's verdict (Storage::set_demoted,
// Storage::set_age_class).
#include "prefix/prefix_index.h"

#include <algorithm>

#include "util/check.h"

namespace hybridkv::prefix {

using storage::kNoPage;
using storage::PageId;

std::optional<CacheGroupId> PrefixIndex::find_resume_group(const StoragePlan& plan) {
  if (!storage::find_eviction_policy(plan.config().policies.eviction).value()->uses_demotion())
    return std::nullopt;
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind == GroupKind::kSsm && g.policy == ReusePolicy::kRequired) return g.id;
  }
  return std::nullopt;
}

// Every block an ACTIVE cache committed stays in its rows while it is ACTIVE (history only
// grows): true unless an attention group may let go of one (a window) or never take it
// (OPTIONAL). PRIVATE groups keep nothing in the tree.
bool PrefixIndex::caches_hold_paths(const StoragePlan& plan) {
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind != GroupKind::kAttention || g.policy == ReusePolicy::kPrivate) continue;
    if (g.window || g.policy != ReusePolicy::kRequired) return false;
  }
  return true;
}

bool PrefixIndex::hold_resumable(NodeId node) {
  if (!path_holds_) return false;
  ++tree_.node(node).resumable_holds;
  count_resumable(node, +1);
  return true;
}

void PrefixIndex::release_resumable(NodeId node) {
  HKV_CHECK(tree_.node(node).resumable_holds > 0, "release of an unheld tree node %u", node.value);
  --tree_.node(node).resumable_holds;
  count_resumable(node, -1);
}

// Tokens of KV (all attention groups) that take the bytes of one snapshot of `group`.
double PrefixIndex::snapshot_tokens(const StoragePlan& plan, CacheGroupId group) {
  double kv_per_token = 0;
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind == GroupKind::kAttention)
      kv_per_token += static_cast<double>(plan.pool_group(g.pool_group).slot_bytes) /
                      plan.config().tokens_per_block;
  }
  const auto snapshot = static_cast<double>(
      plan.pool_group(plan.cache_group(group).page_pool_group(true)).slot_bytes);
  return kv_per_token > 0 ? snapshot / kv_per_token : 0;
}

// A snapshot at depth d saves d tokens of recompute per resume and takes the bytes of
// snapshot_tokens_ tokens of KV besides the d tokens of KV it needs: it is worth
// d / (d + snapshot_tokens_) of what the same bytes of KV alone are worth to an attention model
// (1), times 1 + the resumes it has served or its credit (up to kMaxPricedHits). Its page ages
// 1 / worth times as fast as a neutral page (Page::age_class), so the snapshot of a short prompt
// goes before that of a long one that was used as recently. The KV pages on its path take the
// same class: a snapshot without its KV run, or a run without a snapshot under it, serves no
// resume, so the two should leave together (the run keeps the class of the snapshot below it
// priced last).
void PrefixIndex::price_snapshot(NodeId node, PageId page) {
  if (!prices_) return;
  const auto depth = static_cast<double>(tree_.node(node).end());
  const double worth = depth / (depth + snapshot_tokens_);
  // Once served, a snapshot is at the cap whatever its credit: the credit counts until then.
  const uint32_t served = storage_.page(page).hits;
  const double credit = served == 0 ? continuation_prior(node) : 0;
  const double hits = std::min<double>(served + 1 + credit, kMaxPricedHits);
  const uint8_t age_class = storage::age_class_for(1.0 / (worth * hits));
  storage_.set_age_class(page, age_class);
  age_kv_above(node, age_class);
}

void PrefixIndex::age_kv_above(NodeId node, uint8_t age_class) {
  for (NodeId at = node; at != kNoNode; at = tree_.node(at).parent) {
    for (const CacheGroup& g : plan_.cache_groups()) {
      const PageId pid = tree_.pages(at)[g.id.value].page;
      if (g.kind == GroupKind::kAttention && pid != kNoPage) storage_.set_age_class(pid, age_class);
    }
  }
}

// A request that resumed from the nearest snapshot above `node` and built on it is likely a
// conversation's next turn, and a conversation that went on goes on more often than a new one
// (bench/continuation_rates.py, whole conversation trace: a later prompt extends 0.27 of the
// prompts that continued no earlier one, 0.51 to 0.62 of those that reused 70 % or more of
// themselves from an earlier prompt's end). The new snapshot is credited with that share of a
// resume: the depth share the served snapshot above covers (a short shared prefix, such as a
// system prompt every first turn resumes from, counts for little).
float PrefixIndex::continuation_prior(NodeId node) const {
  const double depth = static_cast<double>(tree_.node(node).end());
  for (NodeId at = tree_.node(node).parent; at != kNoNode; at = tree_.node(at).parent) {
    const PageId above = tree_.pages(at)[resume_group_->value].page;
    if (above == kNoPage) continue;
    if (storage_.page(above).hits == 0) return 0;
    return static_cast<float>(static_cast<double>(tree_.node(at).end()) / depth);
  }
  return 0;
}

template <typename Crossed>
void PrefixIndex::carry_count(NodeId id, int delta, uint32_t Node::*count, Crossed&& crossed) {
  while (id != kNoNode) {
    Node& n = tree_.node(id);
    const bool was = n.*count > 0;
    n.*count = static_cast<uint32_t>(static_cast<int64_t>(n.*count) + delta);
    const bool is = n.*count > 0;
    if (was == is) return;
    crossed(id, is);
    id = n.parent;
  }
}

void PrefixIndex::note_published(NodeId node, CacheGroupId group, PageId page, bool speculative) {
  if (!resume_group_) return;
  if (group == *resume_group_ && speculative) {
    // Demoted from the start, superseding nothing; priced when a match resumes from it.
    tree_.pages(node)[group.value].speculative = true;
    storage_.set_demoted(page, true);
    count_resumable(node, +1);
  } else if (group == *resume_group_) {
    price_snapshot(node, page);
    count_resumable(node, +1);
    mark_superseded(node, true);
  } else if (plan_.cache_group(group).kind == GroupKind::kAttention) {
    storage_.set_demoted(page, tree_.node(node).resumable == 0);
    count_kv(node, +1);
  }
}

// A full-attention block left the tree: until a request computes it again, no match covers
// its start, so the KV pages below its node serve nobody; they leave the tree now (a request
// that computes the block again publishes its own). Snapshots below it stay: the request that
// fills the hole does not snapshot where an earlier one did, and with the hole filled they
// serve again. A page a plan, an operation or a cache still counts on stays too. They count as
// evicted (IterationStats).
void PrefixIndex::drop_orphaned_kv(NodeId node, CacheGroupId group) {
  const CacheGroup& g = plan_.cache_group(group);
  if (!resume_group_ || g.kind != GroupKind::kAttention || g.window ||
      g.policy != ReusePolicy::kRequired) {
    return;
  }
  if (tree_.node(node).kv_below == 0) return;  // no KV left at or below the node
  // The members' buffers, moved out for the call and back after it: a drop allocates nothing.
  std::vector<std::pair<NodeId, CacheGroupId>> orphans = std::move(orphans_);
  std::vector<NodeId> stack = std::move(orphan_walk_);
  orphans.clear();
  stack.assign(1, node);
  while (!stack.empty()) {
    const NodeId at = stack.back();
    stack.pop_back();
    for (const CacheGroup& other : plan_.cache_groups()) {
      const NodePage& np = tree_.pages(at)[other.id.value];
      if (other.kind == GroupKind::kAttention && np.page != kNoPage && np.planned_drops == 0 &&
          !storage_.page(np.page).pinned &&
          storage_.page(np.page).state() == storage::PageState::kDroppable) {
        orphans.push_back({at, other.id});
        ++stats_.groups[other.id.value].orphans_dropped;
      }
    }
    for (NodeId c : tree_.node(at).children) {
      if (tree_.node(c).kv_below > 0) stack.push_back(c);
    }
  }
  // Deepest first: a node is pruned only once nothing below it is left in the list.
  for (auto it = orphans.rbegin(); it != orphans.rend(); ++it) {
    const auto [at, g_id] = *it;
    const PageId pid = tree_.pages(at)[g_id.value].page;
    forget(at, g_id);
    storage_.drop_owned(pid);
    tree_.prune(at);
  }
  orphans_ = std::move(orphans);
  orphan_walk_ = std::move(stack);
}

void PrefixIndex::note_unpublished(NodeId node, CacheGroupId group, bool speculative) {
  if (!resume_group_) return;
  if (group == *resume_group_) {
    count_resumable(node, -1);
    if (!speculative) mark_superseded(node, false);
  } else if (plan_.cache_group(group).kind == GroupKind::kAttention) {
    count_kv(node, -1);
  }
}

void PrefixIndex::note_served(PageId page) {
  storage_.note_hit(page);
  const storage::Page& p = storage_.page(page);
  if (!resume_group_ || p.group != *resume_group_) return;
  if (p.demoted) storage_.set_demoted(page, false);
  const NodeId node(p.owner);
  NodePage& np = tree_.pages(node)[p.group.value];
  if (np.speculative) {  // served: a snapshot like any other from now on
    np.speculative = false;
    mark_superseded(node, true);
  }
  price_snapshot(node, page);
}

// (De)motes the KV pages of every node whose verdict changed.
void PrefixIndex::count_resumable(NodeId id, int delta) {
  carry_count(id, delta, &Node::resumable, [&](NodeId at, bool resumable) {
    for (const CacheGroup& g : plan_.cache_groups()) {
      const PageId pid = tree_.pages(at)[g.id.value].page;
      if (g.kind == GroupKind::kAttention && pid != kNoPage) storage_.set_demoted(pid, !resumable);
    }
  });
}

void PrefixIndex::count_kv(NodeId id, int delta) {
  carry_count(id, delta, &Node::kv_below, [](NodeId, bool) {});
}

std::string PrefixIndex::check_counts() const {
  std::string err;
  tree_.for_each_node([&](NodeId id, const Node& n) {
    uint32_t resumable = (tree_.pages(id)[resume_group_->value].page != kNoPage ? 1 : 0) +
                         n.resumable_holds + n.untidy_drops;
    uint32_t kv = 0;
    for (const CacheGroup& g : plan_.cache_groups()) {
      if (g.kind == GroupKind::kAttention && tree_.pages(id)[g.id.value].page != kNoPage) ++kv;
    }
    for (NodeId c : n.children) {
      resumable += tree_.node(c).resumable > 0 ? 1 : 0;
      kv += tree_.node(c).kv_below > 0 ? 1 : 0;
    }
    if (err.empty() && (n.resumable != resumable || n.kv_below != kv)) {
      err = "tree node " + std::to_string(id.value) + ": resumable " + std::to_string(n.resumable) +
            " / KV below " + std::to_string(n.kv_below) + ", counted " + std::to_string(resumable) +
            " / " + std::to_string(kv);
    }
  });
  return err;
}

// The nearest kept (not speculative) snapshot above `id` on a path with no fork between them
// (kNoNode if none).
NodeId PrefixIndex::superseded_by(NodeId id) const {
  for (NodeId at = tree_.node(id).parent; at != kNoNode; at = tree_.node(at).parent) {
    const Node& n = tree_.node(at);
    if (n.children.size() != 1) return kNoNode;
    const NodePage& np = tree_.pages(at)[resume_group_->value];
    if (np.page != kNoPage && !np.speculative) return at;
  }
  return kNoNode;
}

void PrefixIndex::mark_superseded(NodeId id, bool demoted) {
  const NodeId above = superseded_by(id);
  if (above != kNoNode)
    storage_.set_demoted(tree_.pages(above)[resume_group_->value].page, demoted);
}

}  // namespace hybridkv::prefix
