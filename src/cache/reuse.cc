// Prefix reuse: matching, attaching a match to a new cache, the first resume's private copies,
// commits with deduplication and snapshots, planned drops, and tree upkeep (DESIGN §6).
#include <algorithm>

#include "cache/manager_core.h"
#include "util/check.h"

namespace hybridkv::cache_detail {

using prefix::kNoNode;
using prefix::Node;
using prefix::NodeId;
using prefix::NodePage;

namespace {
constexpr size_t kGpu = 0;
uint64_t blocks_for(uint64_t tokens, uint32_t tpb) { return (tokens + tpb - 1) / tpb; }
bool publishable(const CacheGroup& g) { return g.policy != ReusePolicy::kPrivate; }

// Digests of the multimodal items starting in [begin, end), into `buffer`; no allocation and an
// empty span without items.
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
}  // namespace

MatchPlan ManagerCore::match(prefix::BlockHasher& hasher, const ReuseScope& scope,
                             std::span<const int32_t> tokens,
                             std::span<const MultimodalItem> multimodal) const {
  const ManagerConfig& cfg = plan.config();
  const uint32_t tpb = cfg.tokens_per_block;
  MatchPlan mp;
  ReuseMatch& m = mp.match;
  m.groups.resize(plan.cache_groups().size());
  for (const CacheGroup& g : plan.cache_groups()) m.groups[g.id.value].policy = g.policy;
  // The last prompt token is always computed (its logits start the generation).
  const uint64_t lookup = tokens.empty() ? 0 : tokens.size() - 1;
  m.lookup_tokens = lookup;
  if (!cfg.enable_block_reuse || lookup == 0) return mp;
  mp.root = tree.find(hasher.root(scope));
  if (mp.root == kNoNode) return mp;

  std::vector<std::array<uint8_t, 32>> digest_buffer;
  auto digests = [&](uint64_t begin, uint64_t end) {
    return digests_between(multimodal, begin, end, digest_buffer);
  };
  // Full blocks by key, in batches: the key chain does not wait for the lookups, so a batch of
  // keys is hashed, their index slots prefetched, and then looked up in order (a miss in a
  // million-block index costs about as much as hashing a block).
  constexpr size_t kBatch = 16;
  NodeId node = mp.root;
  uint64_t pos = 0;
  BlockKey chain = tree.node(node).key;
  BlockKey keys[kBatch];
  for (bool diverged = false; !diverged && pos + tpb <= lookup;) {
    size_t n = 0;
    for (; n < kBatch && pos + (n + 1) * tpb <= lookup; ++n) {
      const uint64_t at = pos + n * tpb;
      chain = keys[n] = hasher.key(chain, tokens.subspan(at, tpb), digests(at, at + tpb));
      tree.prefetch(keys[n]);
    }
    for (size_t i = 0; i < n; ++i) {
      const NodeId child = tree.find(keys[i]);
      if (child == kNoNode) {
        diverged = true;
        break;
      }
      mp.path.push_back(child);
      node = child;
      pos += tpb;
    }
  }
  // A partial last block: a partial node matched whole (an exact committed endpoint), or, with
  // enable_partial_reuse, the first tokens of any child.
  uint64_t best = 0;
  bool best_whole = false;
  for (NodeId c : tree.node(node).children) {
    const Node& n = tree.node(c);
    const uint64_t limit = std::min<uint64_t>(n.tokens.size(), lookup - pos);
    uint64_t k = 0;
    while (k < limit && n.tokens[k] == tokens[pos + k]) ++k;
    if (k == 0) continue;
    bool whole = !n.full && k == n.tokens.size();
    if (whole) {
      // The key also covers multimodal digests.
      whole =
          hasher.key(tree.node(node).key, tokens.subspan(pos, k), digests(pos, pos + k)) == n.key;
      if (!whole) continue;
    } else if (!cfg.enable_partial_reuse || !digests(pos, pos + k).empty()) {
      continue;
    }
    if (k > best || (k == best && whole && !best_whole)) {
      best = k;
      best_whole = whole;
      mp.tail = c;
    }
  }
  mp.tail_tokens = best;
  const uint64_t divergence = pos + best;
  m.divergence_tokens = divergence;

  // Pages along the match.
  auto page_at = [&](const CacheGroup& g, uint64_t block) -> std::pair<storage::PageId, uint64_t> {
    const NodePage* np = nullptr;
    uint64_t limit = tpb;
    if (block < mp.path.size()) {
      np = &tree.pages(mp.path[block])[g.id.value];
    } else if (block == mp.path.size() && mp.tail != kNoNode) {
      np = &tree.pages(mp.tail)[g.id.value];
      limit = mp.tail_tokens;
    }
    if (np == nullptr || np->page == storage::kNoPage) return {storage::kNoPage, 0};
    return {np->page, std::min<uint64_t>(np->coverage, limit)};
  };
  // Full attention needs the whole prefix: its covered prefix is computed once, so that each
  // pruning pass costs O(1) for it instead of a walk over every block.
  std::vector<uint64_t> covered_prefix(plan.cache_groups().size(), 0);
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind != GroupKind::kAttention || g.window) continue;
    uint64_t b = 0, covered = 0;
    for (;; ++b) {
      const uint64_t have = page_at(g, b).second;
      covered = b * tpb + have;
      if (have < tpb) break;
    }
    covered_prefix[g.id.value] = covered;
  }
  // The largest L' <= L whose blocks a step from L' reads are covered (one pass).
  auto attention_limit = [&](const CacheGroup& g, uint64_t L) -> uint64_t {
    if (L == 0) return 0;
    if (!g.window) return std::min(L, covered_prefix[g.id.value]);
    const uint64_t last = (L - 1) / tpb;
    const uint64_t first = (L > *g.window ? L - *g.window : 0) / tpb;
    auto covered = [&](uint64_t b) -> std::optional<uint64_t> {
      const uint64_t need = std::min<uint64_t>(L, (b + 1) * tpb) - b * tpb;
      const uint64_t have = page_at(g, b).second;
      if (have >= need) return std::nullopt;
      return b * tpb + have;
    };
    for (uint64_t b = 0; b < std::min<uint64_t>(g.sink_blocks, first); ++b) {
      if (auto cut = covered(b)) return *cut;
    }
    for (uint64_t b = first; b <= last; ++b) {
      if (auto cut = covered(b)) return *cut;
    }
    return L;
  };
  // The largest snapshot position <= L (0 when none).
  auto snapshot_limit = [&](const CacheGroup& g, uint64_t L) -> uint64_t {
    if (mp.tail != kNoNode && best_whole && divergence <= L &&
        tree.pages(mp.tail)[g.id.value].page != storage::kNoPage) {
      return divergence;
    }
    for (uint64_t b = std::min<uint64_t>(L / tpb, mp.path.size()); b > 0; --b) {
      if (tree.pages(mp.path[b - 1])[g.id.value].page != storage::kNoPage) return b * tpb;
    }
    return 0;
  };
  auto fixed_point = [&](uint64_t L, bool with_ssm, ReusePolicy policy, uint64_t* hybrid) {
    for (;;) {
      uint64_t next = L;
      for (const CacheGroup& g : plan.cache_groups()) {
        if (g.policy == policy && g.kind == GroupKind::kAttention)
          next = std::min(next, attention_limit(g, next));
      }
      if (hybrid && next == L) *hybrid = std::min(*hybrid, L);
      if (with_ssm) {
        for (const CacheGroup& g : plan.cache_groups()) {
          if (g.policy == policy && g.kind == GroupKind::kSsm)
            next = std::min(next, snapshot_limit(g, next));
        }
      }
      if (next == L) return L;
      L = next;
    }
  };
  const uint64_t backed_off =
      divergence > cfg.reuse_match_backoff ? divergence - cfg.reuse_match_backoff : 0;
  // Hybrid depth: attention coverage only.
  m.hybrid_tokens = fixed_point(backed_off, false, ReusePolicy::kRequired, nullptr);
  m.reused_tokens = fixed_point(m.hybrid_tokens, true, ReusePolicy::kRequired, nullptr);
  const uint64_t reused = m.reused_tokens;
  for (size_t i = 0; i < mp.path.size(); ++i) {
    if (tree.node(mp.path[i]).demanded && (i + 1) * tpb > reused)
      m.demand_points.push_back((i + 1) * tpb);
  }
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupReuse& r = m.groups[g.id.value];
    if (g.policy == ReusePolicy::kRequired) {
      r.complete = true;
      r.endpoint = reused;
      r.coverage = g.kind == GroupKind::kAttention ? reused : 0;
    } else if (g.policy == ReusePolicy::kOptional) {
      if (g.kind == GroupKind::kSsm) {
        r.endpoint = snapshot_limit(g, backed_off);
        r.complete = reused == 0 || snapshot_limit(g, reused) == reused;
      } else {
        uint64_t L = backed_off;
        while (attention_limit(g, L) != L) L = attention_limit(g, L);
        r.endpoint = L;
        r.coverage = L;
        r.complete = attention_limit(g, reused) == reused;
      }
    }
  }
  return mp;
}

void ManagerCore::record_match_stats(const CacheRecord& rec, bool optional_only) {
  const ReuseMatch& m = rec.match;
  if (m.lookup_tokens == 0) return;
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.policy == ReusePolicy::kPrivate) continue;
    if ((g.policy == ReusePolicy::kOptional) != optional_only) continue;
    if (g.policy == ReusePolicy::kOptional && !rec.groups[g.id.value].selected) continue;
    GroupReuseStats& s = reuse_stats.groups[g.id.value];
    const uint64_t reused = m.reused_tokens;
    ++s.lookups;
    if (reused > 0)
      ++s.hits;
    else
      ++s.misses;
    s.reused_tokens += reused;
    s.unreused_tokens += m.lookup_tokens - reused;
    if (g.kind == GroupKind::kSsm && reused > 0) {
      if (reused % plan.config().tokens_per_block == 0)
        ++s.aligned_snapshot_hits;
      else
        ++s.unaligned_snapshot_hits;
    }
  }
}

void ManagerCore::attach_match(CacheRecord& rec, const MatchPlan& mp) {
  const uint32_t tpb = plan.config().tokens_per_block;
  const uint64_t L = mp.match.reused_tokens;
  rec.match = mp.match;
  rec.capacity = rec.history = rec.committed = L;
  const uint64_t blocks = blocks_for(L, tpb);
  rec.attention_blocks = blocks;
  auto take = [&](storage::PageId page) {
    storage::Page& p = storage.page(page);
    ++p.suspended_refs;
    storage.refresh(page);
    ++reuse_stats.pages_served_by_tier[static_cast<size_t>(p.tier)];
  };
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kAttention) {
      gs.pages.assign(blocks * rec.beam_width, kNoPage);
      for (uint32_t k = 0; k < rec.beam_width; ++k) gs.tables[k].assign(blocks, kBadPageIndex);
      if (g.window) gs.stale_from = (L > *g.window ? L - *g.window : 0) / tpb;
    }
    if (L == 0 || !publishable(g)) continue;
    if (g.kind == GroupKind::kAttention) {
      for (uint64_t b = 0; b < blocks; ++b) {
        if (!block_needed(g, b, L, L)) continue;
        const NodePage* np = nullptr;
        if (b < mp.path.size())
          np = &tree.pages(mp.path[b])[g.id.value];
        else if (mp.tail != kNoNode)
          np = &tree.pages(mp.tail)[g.id.value];
        if (np == nullptr || np->page == kNoPage) continue;  // an incomplete OPTIONAL group
        const uint32_t beams = b < rec.shared_blocks ? 1 : rec.beam_width;
        for (uint32_t k = 0; k < rec.beam_width; ++k) gs.pages[b * rec.beam_width + k] = np->page;
        for (uint32_t k = 0; k < beams; ++k) take(np->page);
      }
      gs.copy_pending = L % tpb != 0;
    } else {
      NodeId at = kNoNode;
      if (mp.tail != kNoNode && mp.path.size() * tpb + mp.tail_tokens == L)
        at = mp.tail;
      else if (L % tpb == 0 && L / tpb <= mp.path.size())
        at = mp.path[L / tpb - 1];
      const storage::PageId snap = at == kNoNode ? kNoPage : tree.pages(at)[g.id.value].page;
      if (snap == kNoPage) continue;
      for (PageId& e : gs.pages) {
        e = snap;
        take(snap);
      }
      gs.copy_pending = true;
    }
  }
  // The next commit hangs under the last full block of the match.
  rec.commit_parent = L >= tpb ? mp.path[L / tpb - 1] : mp.root;
  if (rec.commit_parent != kNoNode) ++tree.node(rec.commit_parent).pins;
  record_match_stats(rec, false);
}

Status ManagerCore::prepare_first_resume(uint32_t id, const std::vector<CacheGroupId>* chosen) {
  CacheRecord& rec = caches[id];
  std::vector<bool> selected(plan.cache_groups().size(), false);
  if (chosen) {
    for (CacheGroupId g : *chosen) {
      if (g.value >= plan.cache_groups().size()) {
        return Status::invalid(label(id) + ": resume: unknown cache group " +
                               std::to_string(g.value));
      }
      const CacheGroup& group = plan.cache_group(g);
      if (group.policy != ReusePolicy::kOptional) {
        return Status::invalid(label(id) + ": resume: cache group " + std::to_string(g.value) +
                               " is " + reuse_policy_name(group.policy) +
                               ", only OPTIONAL groups can be selected");
      }
      if (!rec.match.groups[g.value].complete) {
        return Status::invalid(
            label(id) + ": resume: OPTIONAL cache group " + std::to_string(g.value) +
            " matched up to " + std::to_string(rec.match.groups[g.value].endpoint) +
            " tokens, not the reused " + std::to_string(rec.match.reused_tokens));
      }
      selected[g.value] = true;
    }
  }
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.policy == ReusePolicy::kOptional) rec.groups[g.id.value].selected = selected[g.id.value];
  }
  return Status::ok();
}

void ManagerCore::finish_first_resume(CacheRecord& rec) {
  // Unselected OPTIONAL groups give back what they matched: the engine recomputes that state.
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (gs.selected) continue;
    if (g.kind == GroupKind::kAttention) {
      for (uint64_t b = 0; b < rec.attention_blocks; ++b) {
        const uint32_t beams = b < rec.shared_blocks ? 1 : rec.beam_width;
        for (uint32_t k = 0; k < beams; ++k) {
          const PageId pid = gs.pages[b * rec.beam_width + k];
          if (pid == kNoPage) continue;
          --storage.page(pid).active_refs;
          storage.refresh(pid);
        }
        std::fill(gs.pages.begin() + static_cast<int64_t>(b * rec.beam_width),
                  gs.pages.begin() + static_cast<int64_t>((b + 1) * rec.beam_width), kNoPage);
      }
    } else {
      for (PageId& e : gs.pages) {
        if (e == kNoPage) continue;
        --storage.page(e).active_refs;
        storage.refresh(e);
        e = kNoPage;
      }
    }
    gs.copy_pending = false;
  }
  // The partially matched tail block and the SSM snapshots are copied into private pages:
  // shared pages are never written.
  auto private_copy = [&](const CacheGroup& g, PageId src) {
    const PageId dst = storage.allocate(g.id, kGpu);
    storage.page(dst).active_refs = 1;
    storage.refresh(dst);
    storage.copy_page(src, dst);
    --storage.page(src).active_refs;
    storage.refresh(src);
    return dst;
  };
  for (const CacheGroup& g : plan.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (!gs.copy_pending) continue;
    gs.copy_pending = false;
    if (g.kind == GroupKind::kSsm) {
      for (PageId& e : gs.pages) {
        if (e != kNoPage) e = private_copy(g, e);
      }
      continue;
    }
    const uint64_t b = rec.attention_blocks - 1;
    PageId* row = &gs.pages[b * rec.beam_width];
    if (row[0] == kNoPage) continue;
    if (b < rec.shared_blocks) {
      std::fill(row, row + rec.beam_width, private_copy(g, row[0]));
    } else {
      for (uint32_t k = 0; k < rec.beam_width; ++k) row[k] = private_copy(g, row[k]);
    }
  }
  rec.first_resume_done = true;
  record_match_stats(rec, true);
}

void ManagerCore::emit(CacheEventKind kind, NodeId node, CacheGroupId group) {
  if (!plan.config().record_events) return;
  const Node& n = tree.node(node);
  CacheEvent e;
  e.kind = kind;
  e.key = n.key;
  if (n.parent != kNoNode) e.parent_key = tree.node(n.parent).key;
  if (kind == CacheEventKind::kStored) e.tokens = n.tokens;
  e.group = group;
  const PageId pid = tree.pages(node)[group.value].page;
  if (pid != kNoPage) {
    e.tier = storage.page(pid).tier;
    e.priority = storage.page(pid).priority;
  }
  events.push_back(std::move(e));
}

void ManagerCore::publish(NodeId node, CacheGroupId group, PageId page, uint32_t coverage) {
  NodePage& np = tree.pages(node)[group.value];
  HKV_CHECK(np.page == kNoPage, "publishing over an existing tree page");
  np.page = page;
  np.coverage = coverage;
  storage::Page& p = storage.page(page);
  p.in_tree = true;
  p.tree_node = node;
  storage.refresh(page);
  emit(CacheEventKind::kStored, node, group);
}

void ManagerCore::unpublish(NodeId node, CacheGroupId group) {
  NodePage& np = tree.pages(node)[group.value];
  if (np.page == kNoPage) return;
  emit(CacheEventKind::kRemoved, node, group);
  const PageId pid = np.page;
  np = NodePage{};
  storage::Page& p = storage.page(pid);
  p.in_tree = false;
  p.tree_node = UINT32_MAX;
  storage.refresh(pid);
  tree.prune(node);
}

void ManagerCore::on_page_dropped(PageId page) {
  const storage::Page& p = storage.page(page);
  const NodeId node = p.tree_node;
  HKV_CHECK(node != UINT32_MAX, "dropped page %u is not in the tree", page);
  emit(CacheEventKind::kRemoved, node, p.group);
  tree.pages(node)[p.group.value] = NodePage{};
  storage.page(page).tree_node = UINT32_MAX;
  tree.prune(node);
}

// A tree page changed tier or priority: an update event.
void ManagerCore::on_page_moved(PageId page) {
  const storage::Page& p = storage.page(page);
  if (p.in_tree) emit(CacheEventKind::kUpdated, p.tree_node, p.group);
}

Status ManagerCore::commit(uint32_t id, std::span<const int32_t> tokens, bool is_end) {
  if (Status s = expect_state(id, CacheState::kActive, "commit"); !s) return s;
  CacheRecord& rec = caches[id];
  const ManagerConfig& cfg = plan.config();
  const uint32_t tpb = cfg.tokens_per_block;
  if (!rec.committing) {
    return Status(StatusCode::kFailedPrecondition, label(id) + ": commit after stop_committing");
  }
  const uint64_t c = rec.committed, e = c + tokens.size();
  if (e > rec.history) {
    return Status::invalid(label(id) + ": commit of tokens [" + std::to_string(c) + ", " +
                           std::to_string(e) + ") past history " + std::to_string(rec.history) +
                           " (only computed tokens can be committed)");
  }
  for (uint64_t i = c; i < std::min<uint64_t>(e, rec.tokens.size()); ++i) {
    if (rec.tokens[i] != tokens[i - c]) {
      return Status::invalid(label(id) + ": commit token " + std::to_string(i) + " is " +
                             std::to_string(tokens[i - c]) + " but the request has " +
                             std::to_string(rec.tokens[i]));
    }
  }
  if (!cfg.enable_block_reuse || tokens.empty()) {
    if (is_end) rec.committing = false;
    return Status::ok();
  }
  // What gets published: full blocks completed by this commit; with commit_min_snapshot (or
  // at the end) the partial tail; an SSM snapshot where the commit ends at history.
  const bool tail = e % tpb != 0 && (cfg.commit_min_snapshot || is_end);
  const bool snapshot = e == rec.history && (e % tpb == 0 || tail);
  // Fresh GPU pages needed for copies (a commit at the end moves instead of copying).
  std::vector<uint64_t> need(plan.pool_groups().size(), 0);
  if (!is_end) {
    for (const CacheGroup& g : plan.cache_groups()) {
      if (!publishable(g)) continue;
      if (g.kind == GroupKind::kSsm && snapshot) need[g.pool_group.value] += 1;
      if (g.kind == GroupKind::kAttention && tail) need[g.pool_group.value] += 1;
    }
  }
  if (Status s = check_room("commit", need, storage.empty_exclusions()); !s) {
    return Status(s.code(), label(id) + ": " + s.message());
  }
  if (rec.tokens.size() < e)
    rec.tokens.insert(rec.tokens.end(),
                      tokens.begin() + static_cast<int64_t>(rec.tokens.size() - c), tokens.end());
  for (const PoolGroup& pg : plan.pool_groups()) {
    if (need[pg.id.value]) storage.make_room(kGpu, pg.id, need[pg.id.value]);
  }
  if (rec.commit_parent == kNoNode) {
    rec.commit_parent = tree.root(hasher.root(rec.scope));
    ++tree.node(rec.commit_parent).pins;
  }
  auto move_parent = [&](NodeId next) {
    ++tree.node(next).pins;
    const NodeId old = rec.commit_parent;
    --tree.node(old).pins;
    rec.commit_parent = next;
    tree.prune(old);
  };
  const std::span<const int32_t> all(rec.tokens);
  std::vector<std::array<uint8_t, 32>> digest_buffer;
  // Full blocks: deduplicate against the tree.
  for (uint64_t b = c / tpb; (b + 1) * tpb <= e; ++b) {
    const Node& parent = tree.node(rec.commit_parent);
    const BlockKey key =
        hasher.key(parent.key, all.subspan(b * tpb, tpb),
                   digests_between(rec.multimodal, b * tpb, (b + 1) * tpb, digest_buffer));
    NodeId node = tree.find(key);
    if (node == kNoNode) node = tree.add(rec.commit_parent, key, all.subspan(b * tpb, tpb), true);
    for (const CacheGroup& g : plan.cache_groups()) {
      if (!publishable(g) || g.kind != GroupKind::kAttention) continue;
      GroupState& gs = rec.groups[g.id.value];
      if (b >= rec.attention_blocks) continue;
      PageId* row = &gs.pages[b * rec.beam_width];
      const PageId own = row[0];
      if (own == kNoPage) continue;  // a released window block
      const NodePage& np = tree.pages(node)[g.id.value];
      if (np.page == kNoPage) {
        publish(node, g.id, own, tpb);
      } else if (np.page != own && np.coverage == tpb &&
                 storage.page(np.page).tier == TierKind::kGpu) {
        // Adopt the tree's page (same tokens, same bytes) and free our own.
        const uint32_t entries = b < rec.shared_blocks ? rec.beam_width : 1;
        for (uint32_t k = 0; k < entries; ++k) row[k] = np.page;
        ++storage.page(np.page).active_refs;
        storage.refresh(np.page);
        --storage.page(own).active_refs;
        storage.refresh(own);
        set_table_entries(rec, g, b, b + 1);
      }
    }
    move_parent(node);
  }
  // The partial tail block: a leaf of its own, never rebased.
  NodeId snapshot_node = e % tpb == 0 ? rec.commit_parent : kNoNode;
  if (tail) {
    const uint64_t start = e / tpb * tpb;
    const BlockKey key = hasher.key(tree.node(rec.commit_parent).key, all.subspan(start, e - start),
                                    digests_between(rec.multimodal, start, e, digest_buffer));
    NodeId node = tree.find(key);
    if (node == kNoNode)
      node = tree.add(rec.commit_parent, key, all.subspan(start, e - start), false);
    snapshot_node = node;
    for (const CacheGroup& g : plan.cache_groups()) {
      if (!publishable(g) || g.kind != GroupKind::kAttention) continue;
      const uint64_t b = start / tpb;
      GroupState& gs = rec.groups[g.id.value];
      if (b >= rec.attention_blocks || tree.pages(node)[g.id.value].page != kNoPage) continue;
      const PageId own = gs.pages[b * rec.beam_width];
      if (own == kNoPage) continue;
      if (is_end) {
        publish(node, g.id, own, static_cast<uint32_t>(e - start));
      } else {
        const PageId copy = storage.allocate(g.id, kGpu);
        storage.copy_page(own, copy);
        publish(node, g.id, copy, static_cast<uint32_t>(e - start));
      }
    }
  }
  // SSM snapshots at the commit's end.
  if (snapshot && snapshot_node != kNoNode && !tree.node(snapshot_node).tokens.empty()) {
    for (const CacheGroup& g : plan.cache_groups()) {
      if (!publishable(g) || g.kind != GroupKind::kSsm) continue;
      GroupState& gs = rec.groups[g.id.value];
      const PageId own = gs.pages[0];
      if (own == kNoPage || tree.pages(snapshot_node)[g.id.value].page != kNoPage) continue;
      const uint32_t coverage = static_cast<uint32_t>(tree.node(snapshot_node).tokens.size());
      if (is_end) {
        // The state moves into the tree: the request computes nothing more.
        publish(snapshot_node, g.id, own, coverage);
        for (PageId& entry : gs.pages) {
          if (entry == own) entry = kNoPage;
        }
        --storage.page(own).active_refs;
        storage.refresh(own);
      } else {
        const PageId copy = storage.allocate(g.id, kGpu);
        storage.copy_page(own, copy);
        publish(snapshot_node, g.id, copy, coverage);
      }
    }
  }
  rec.committed = e;
  const CopyEvent copied = storage.flush();
  if (copied.ticket > rec.ready.ticket) rec.ready = copied;
  if (is_end) (void)stop_committing(id);
  return Status::ok();
}

Status ManagerCore::stop_committing(uint32_t id) {
  CacheRecord& rec = caches[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": stop_committing on a CLOSED cache");
  }
  rec.committing = false;
  if (rec.commit_parent != kNoNode) {
    const NodeId old = rec.commit_parent;
    rec.commit_parent = kNoNode;
    --tree.node(old).pins;
    tree.prune(old);
  }
  return Status::ok();
}

Status ManagerCore::plan_snapshot_drop(uint32_t id) {
  CacheRecord& rec = caches[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": plan_snapshot_drop on a CLOSED cache");
  }
  const uint32_t tpb = plan.config().tokens_per_block;
  // The node ending at the last commit: the commit parent when aligned, else the tail leaf.
  NodeId node = kNoNode;
  if (rec.committed % tpb == 0) {
    node = rec.commit_parent;
  } else if (rec.commit_parent != kNoNode) {
    for (NodeId c : tree.node(rec.commit_parent).children) {
      if (!tree.node(c).full && tree.node(c).end() == rec.committed) node = c;
    }
  }
  if (node == kNoNode || tree.node(node).tokens.empty()) {
    return Status(StatusCode::kNotFound, label(id) + ": no committed snapshot to plan a drop of");
  }
  for (const CacheGroup& g : plan.cache_groups()) {
    const bool target = g.kind == GroupKind::kSsm || g.window.has_value();
    NodePage& np = tree.pages(node)[g.id.value];
    if (!target || np.page == kNoPage) continue;
    ++np.planned_drops;
    ++tree.node(node).pins;  // the node stays until the plan runs
    rec.planned_drops.push_back({node, g.id.value});
  }
  return Status::ok();
}

Status ManagerCore::release_planned_drops(uint32_t id) {
  CacheRecord& rec = caches[id];
  for (const auto& [node, group] : rec.planned_drops) {
    NodePage& np = tree.pages(node)[group];
    --tree.node(node).pins;
    if (np.page != kNoPage && np.planned_drops > 0 && --np.planned_drops == 0) {
      unpublish(node, CacheGroupId(group));
    } else {
      tree.prune(node);
    }
  }
  rec.planned_drops.clear();
  return Status::ok();
}

void ManagerCore::clear_reusable_blocks() {
  for (NodeId id = 0; id < tree.capacity(); ++id) {
    if (!tree.node(id).live) continue;
    for (const CacheGroup& g : plan.cache_groups()) {
      if (tree.node(id).live) unpublish(id, g.id);
    }
  }
}

std::string ManagerCore::check_tree() const {
  const uint32_t tpb = plan.config().tokens_per_block;
  for (NodeId id = 0; id < tree.capacity(); ++id) {
    const Node& n = tree.node(id);
    if (!n.live) continue;
    if (tree.find(n.key) != id)
      return "tree node " + std::to_string(id) + " is not indexed by its key";
    if (n.parent != kNoNode && n.start != tree.node(n.parent).end())
      return "tree node start is off";
    if (n.tokens.size() > tpb || (n.full && n.parent != kNoNode && n.tokens.size() != tpb)) {
      return "tree node " + std::to_string(id) + " has a wrong token count";
    }
    for (const CacheGroup& g : plan.cache_groups()) {
      const NodePage& np = tree.pages(id)[g.id.value];
      if (np.page == kNoPage) continue;
      const storage::Page& p = storage.page(np.page);
      if (!p.live || !p.in_tree || p.tree_node != id || p.group != g.id) {
        return "tree node " + std::to_string(id) + " group " + std::to_string(g.id.value) +
               " holds a page that does not point back";
      }
      if (np.coverage > n.tokens.size()) return "tree page coverage exceeds its block";
      if (!publishable(g)) return "a PRIVATE page is in the tree";
    }
  }
  for (PageId pid = 0; pid < storage.page_capacity(); ++pid) {
    const storage::Page& p = storage.page(pid);
    if (!p.live || !p.in_tree) continue;
    if (p.tree_node >= tree.capacity() || !tree.node(p.tree_node).live ||
        tree.pages(p.tree_node)[p.group.value].page != pid) {
      return "page " + std::to_string(pid) + " is in_tree but no node holds it";
    }
  }
  return "";
}

}  // namespace hybridkv::cache_detail
