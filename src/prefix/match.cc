// Matching a prompt against the tree (DESIGN §6): walk full blocks by key, take a partial last
// block, back off, then prune across REQUIRED groups until each can restore the endpoint.
#include <algorithm>
#include <optional>

#include "prefix/prefix_index.h"
#include "util/blocks.h"

namespace hybridkv::prefix {

using storage::kNoPage;
using storage::PageId;

namespace {

// One match in progress: the walk's results and the pruning rules over them.
class Matcher {
 public:
  Matcher(const StoragePlan& plan, const RadixTree& tree, BlockHasher& hasher,
          std::span<const int32_t> tokens, std::span<const MultimodalItem> multimodal,
          std::span<const BlockKey> keys, uint64_t lookup, MatchPlan& mp)
      : plan_(plan),
        tree_(tree),
        hasher_(hasher),
        tokens_(tokens),
        multimodal_(multimodal),
        keys_(keys),
        mp_(mp),
        tpb_(plan.config().tokens_per_block),
        lookup_(lookup) {}

  void walk_full_blocks();
  void match_tail();
  void prune_and_report();
  void try_partial_siblings(uint64_t end);

 private:
  std::span<const std::array<uint8_t, 32>> digests(uint64_t begin, uint64_t end) {
    return digests_between(multimodal_, begin, end, digest_buffer_);
  }
  // The group's page for `block` along the match, and the tokens of it the match may use.
  std::pair<PageId, uint64_t> page_at(const CacheGroup& g, uint64_t block) const;
  uint64_t covered_prefix(const CacheGroup& g) const;
  uint64_t attention_limit(const CacheGroup& g, uint64_t L) const;
  uint64_t snapshot_limit(const CacheGroup& g, uint64_t L) const;
  uint64_t fixed_point(uint64_t L, bool with_ssm) const;
  uint64_t dropped_snapshot_tokens(uint64_t reused, uint64_t hybrid) const;
  // Tokens of `child` (under `parent`, at pos_) the match may use as its tail (0: none), and
  // whether that is the whole of a committed partial block.
  uint64_t tail_tokens(NodeId parent, NodeId child, bool& whole);
  // Where the match's tail ends (the divergence, unless a partial sibling replaced the tail).
  uint64_t tail_end() const { return mp_.path.size() * tpb_ + mp_.tail_tokens; }
  void prune(uint64_t end);
  void report_groups(uint64_t backed_off);
  std::vector<std::pair<uint64_t, uint64_t>> coverage_ranges(const CacheGroup& g,
                                                             uint64_t end) const;

  const StoragePlan& plan_;
  const RadixTree& tree_;
  BlockHasher& hasher_;
  std::span<const int32_t> tokens_;
  std::span<const MultimodalItem> multimodal_;
  std::span<const BlockKey> keys_;  // computed ahead for the first full blocks
  MatchPlan& mp_;
  const uint32_t tpb_;
  const uint64_t lookup_;  // tokens looked up (the prompt less its last token)
  std::vector<std::array<uint8_t, 32>> digest_buffer_;
  uint64_t pos_ = 0;               // tokens matched by full blocks
  bool tail_whole_ = false;        // the tail is a partial node matched whole (an exact endpoint)
  std::vector<uint64_t> covered_;  // full attention: the covered prefix, by group
};

void Matcher::walk_full_blocks() {
  // Full blocks by key, in batches: the key chain does not wait for the lookups, so a batch of
  // keys is hashed, their index slots prefetched, and then looked up in order (a miss in a
  // million-block index costs about as much as hashing a block).
  constexpr size_t kBatch = 16;
  BlockKey chain = tree_.node(mp_.root).key;
  BlockKey keys[kBatch];
  for (bool diverged = false; !diverged && pos_ + tpb_ <= lookup_;) {
    size_t n = 0;
    for (; n < kBatch && pos_ + (n + 1) * tpb_ <= lookup_; ++n) {
      const uint64_t at = pos_ + n * tpb_;
      chain = keys[n] = at / tpb_ < keys_.size()
                            ? keys_[at / tpb_]
                            : hasher_.key(chain, tokens_.subspan(at, tpb_), digests(at, at + tpb_));
      tree_.prefetch(keys[n]);
    }
    for (size_t i = 0; i < n; ++i) {
      const NodeId child = tree_.find(keys[i]);
      if (child == kNoNode) {
        diverged = true;
        break;
      }
      // The pruning passes read every block's pages next: fetched while the walk goes on.
      __builtin_prefetch(tree_.pages(child).data());
      mp_.path.push_back(child);
      pos_ += tpb_;
    }
  }
}

uint64_t Matcher::tail_tokens(NodeId parent, NodeId child, bool& whole) {
  const Node& n = tree_.node(child);
  const uint64_t limit = std::min<uint64_t>(n.tokens.size(), lookup_ - pos_);
  uint64_t k = 0;
  while (k < limit && n.tokens[k] == tokens_[pos_ + k]) ++k;
  if (k == 0) return 0;
  whole = !n.full && k == n.tokens.size();
  // Without partial reuse a partial block is reused only where the lookup ends exactly at a
  // committed endpoint (the tail node matched whole): no other sequence's block is borrowed.
  if (!plan_.config().enable_partial_reuse && !(whole && pos_ + k == lookup_)) return 0;
  if (whole) {
    // The key also covers multimodal digests.
    whole = hasher_.key(tree_.node(parent).key, tokens_.subspan(pos_, k),
                        digests(pos_, pos_ + k)) == n.key;
    return whole ? k : 0;
  }
  return digests(pos_, pos_ + k).empty() ? k : 0;
}

void Matcher::match_tail() {
  // A partial last block: a partial node matched whole (an exact committed endpoint), or, with
  // enable_partial_reuse, the first tokens of any child.
  const NodeId node = mp_.path.empty() ? mp_.root : mp_.path.back();
  uint64_t best = 0;
  const Node& n = tree_.node(node);
  for (size_t i = 0; pos_ < lookup_ && i < n.children.size(); ++i) {
    if (n.heads[i].first_token != tokens_[pos_]) continue;  // shares no token: no tail
    bool whole = false;
    const uint64_t k = tail_tokens(node, n.children[i], whole);
    if (k > best || (k > 0 && k == best && whole && !tail_whole_)) {
      best = k;
      tail_whole_ = whole;
      mp_.tail = n.children[i];
    }
  }
  mp_.tail_tokens = best;
  mp_.match.divergence_tokens = pos_ + best;
}

std::pair<PageId, uint64_t> Matcher::page_at(const CacheGroup& g, uint64_t block) const {
  const NodePage* np = nullptr;
  uint64_t limit = tpb_;
  if (block < mp_.path.size()) {
    np = &tree_.pages(mp_.path[block])[g.id.value];
  } else if (block == mp_.path.size() && mp_.tail != kNoNode) {
    np = &tree_.pages(mp_.tail)[g.id.value];
    limit = mp_.tail_tokens;
  }
  if (np == nullptr || np->page == kNoPage) return {kNoPage, 0};
  return {np->page, std::min<uint64_t>(np->coverage, limit)};
}

// Full attention needs the whole prefix: its covered prefix is computed once, so that each
// pruning pass costs O(1) for it instead of a walk over every block.
uint64_t Matcher::covered_prefix(const CacheGroup& g) const {
  for (uint64_t b = 0;; ++b) {
    const uint64_t have = page_at(g, b).second;
    if (have < tpb_) return b * tpb_ + have;
  }
}

// The largest L' <= L whose blocks a step from L' reads are covered (one pass).
uint64_t Matcher::attention_limit(const CacheGroup& g, uint64_t L) const {
  if (L == 0) return 0;
  if (!g.window) return std::min(L, covered_[g.id.value]);
  const uint64_t last = (L - 1) / tpb_;
  const uint64_t first = g.first_live_block(L, tpb_);
  auto cut = [&](uint64_t b) -> std::optional<uint64_t> {
    const uint64_t need = std::min<uint64_t>(L, (b + 1) * tpb_) - b * tpb_;
    const uint64_t have = page_at(g, b).second;
    if (have >= need) return std::nullopt;
    return b * tpb_ + have;
  };
  for (uint64_t b = 0; b < std::min<uint64_t>(g.sink_blocks, first); ++b) {
    if (auto c = cut(b)) return *c;
  }
  for (uint64_t b = first; b <= last; ++b) {
    if (auto c = cut(b)) return *c;
  }
  return L;
}

// The largest snapshot position <= L (0 when none).
uint64_t Matcher::snapshot_limit(const CacheGroup& g, uint64_t L) const {
  const uint64_t tail = tail_end();
  if (mp_.tail != kNoNode && tail_whole_ && tail <= L &&
      tree_.pages(mp_.tail)[g.id.value].page != kNoPage) {
    return tail;
  }
  for (uint64_t b = std::min<uint64_t>(L / tpb_, mp_.path.size()); b > 0; --b) {
    if (tree_.pages(mp_.path[b - 1])[g.id.value].page != kNoPage) return b * tpb_;
  }
  return 0;
}

// Invariant of the loop: L only decreases, and every limit function returns a value <= its
// argument that is itself restorable by that group alone; so the loop stops at the largest
// L' <= L that every REQUIRED group (attention, and SSM when with_ssm) can restore at once:
// shortening for one group can only shorten (never lengthen) what another allows.
uint64_t Matcher::fixed_point(uint64_t L, bool with_ssm) const {
  for (;;) {
    uint64_t next = L;
    for (const CacheGroup& g : plan_.cache_groups()) {
      if (g.policy == ReusePolicy::kRequired && g.kind == GroupKind::kAttention)
        next = std::min(next, attention_limit(g, next));
    }
    for (const CacheGroup& g : plan_.cache_groups()) {
      if (with_ssm && g.policy == ReusePolicy::kRequired && g.kind == GroupKind::kSsm)
        next = std::min(next, snapshot_limit(g, next));
    }
    if (next == L) return L;
    L = next;
  }
}

// Tokens past `reused` up to the deepest block end at or before `hybrid` where a snapshot was
// dropped (Node::snapshot_dropped): what keeping it would have added to this match.
uint64_t Matcher::dropped_snapshot_tokens(uint64_t reused, uint64_t hybrid) const {
  if (hybrid <= reused) return 0;
  if (mp_.tail != kNoNode && tail_whole_ && tail_end() == hybrid &&
      tree_.node(mp_.tail).snapshot_dropped) {
    return hybrid - reused;
  }
  for (uint64_t b = std::min<uint64_t>(hybrid / tpb_, mp_.path.size()); b * tpb_ > reused; --b) {
    if (tree_.node(mp_.path[b - 1]).snapshot_dropped) return b * tpb_ - reused;
  }
  return 0;
}

// The fixed points below `end` (the match's end after backoff) over the current path and tail.
void Matcher::prune(uint64_t end) {
  covered_.assign(plan_.cache_groups().size(), 0);
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kAttention && !g.window) covered_[g.id.value] = covered_prefix(g);
  }
  ReuseMatch& m = mp_.match;
  m.hybrid_tokens = fixed_point(std::min(end, tail_end()), false);  // attention coverage only
  m.reused_tokens = fixed_point(m.hybrid_tokens, true);
}

void Matcher::prune_and_report() {
  ReuseMatch& m = mp_.match;
  const uint64_t backoff = plan_.config().reuse_match_backoff;
  const uint64_t backed_off = m.divergence_tokens > backoff ? m.divergence_tokens - backoff : 0;
  prune(backed_off);
  try_partial_siblings(backed_off);
  m.dropped_snapshot_tokens = dropped_snapshot_tokens(m.reused_tokens, m.hybrid_tokens);
  // Blocks ending past the reused tokens only (i + 1 > reused / tpb): the nodes below are not
  // read again.
  for (size_t i = m.reused_tokens / tpb_; i < mp_.path.size(); ++i) {
    if (tree_.node(mp_.path[i]).demanded) m.demand_points.push_back((i + 1) * tpb_);
  }
  report_groups(backed_off);
}

// A match cut inside block c of its full path (a page some group needs is missing there, e.g. a
// window page freed before the block was committed) may restore more through a partial sibling
// of that block: an earlier, shorter commit of the same tokens whose pages are all there. Each
// sibling is tried as the tail after c full blocks; the best one wins if it beats the cut. The
// backoff was taken off the match's end once; a sibling's endpoint lies before that end.
void Matcher::try_partial_siblings(uint64_t end) {
  const uint64_t c = mp_.match.reused_tokens / tpb_;
  if (c >= mp_.path.size() || mp_.match.reused_tokens >= end) return;
  const NodeId parent = c == 0 ? mp_.root : mp_.path[c - 1];
  const Node& up = tree_.node(parent);
  auto partial = [&](const ChildHead& h) { return h.tokens < tpb_; };
  if (std::none_of(up.heads.begin(), up.heads.end(), partial)) return;
  const MatchPlan cut = mp_;
  const bool cut_whole = tail_whole_;
  const std::vector<uint64_t> cut_covered = covered_;
  MatchPlan best = mp_;
  bool best_whole = tail_whole_;
  std::vector<uint64_t> best_covered = covered_;
  for (size_t i = 0; i < up.children.size(); ++i) {
    if (!partial(up.heads[i])) continue;
    const NodeId sibling = up.children[i];
    mp_.path.assign(cut.path.begin(), cut.path.begin() + static_cast<int64_t>(c));
    pos_ = c * tpb_;
    bool whole = false;
    const uint64_t k = tail_tokens(parent, sibling, whole);
    if (k == 0) continue;
    mp_.tail = sibling;
    mp_.tail_tokens = k;
    tail_whole_ = whole;
    prune(end);
    if (mp_.match.reused_tokens > best.match.reused_tokens) {
      best = mp_;
      best_whole = whole;
      best_covered = covered_;
    }
  }
  // The winner's path, tail and covered prefixes: report_groups reads all three.
  const bool sibling = best.match.reused_tokens > cut.match.reused_tokens;
  mp_ = sibling ? std::move(best) : cut;
  tail_whole_ = sibling ? best_whole : cut_whole;
  covered_ = sibling ? std::move(best_covered) : cut_covered;
  pos_ = mp_.path.size() * tpb_;
}

void Matcher::report_groups(uint64_t backed_off) {
  ReuseMatch& m = mp_.match;
  const uint64_t reused = m.reused_tokens;
  for (const CacheGroup& g : plan_.cache_groups()) {
    GroupReuse& r = m.groups[g.id.value];
    if (g.policy == ReusePolicy::kRequired) {
      r.complete = true;
      r.endpoint = reused;
      r.coverage = g.kind == GroupKind::kAttention ? reused : 0;
    } else if (g.policy == ReusePolicy::kOptional && g.kind == GroupKind::kSsm) {
      r.endpoint = snapshot_limit(g, backed_off);
      r.complete = reused == 0 || snapshot_limit(g, reused) == reused;
    } else if (g.policy == ReusePolicy::kOptional) {
      uint64_t L = backed_off;
      while (attention_limit(g, L) != L) L = attention_limit(g, L);
      r.endpoint = r.coverage = L;
      r.complete = attention_limit(g, reused) == reused;
    }
    r.ranges = coverage_ranges(g, g.kind == GroupKind::kSsm ? r.endpoint : r.coverage);
  }
}

// What a match ending at `end` supplies for one group, as token ranges (GroupReuse::ranges).
std::vector<std::pair<uint64_t, uint64_t>> Matcher::coverage_ranges(const CacheGroup& g,
                                                                    uint64_t end) const {
  if (end == 0) return {};
  if (!g.window) return {{0, end}};
  const uint64_t live = g.first_live_block(end, tpb_) * tpb_;
  const uint64_t sinks = std::min<uint64_t>(g.sink_blocks * tpb_, end);
  if (sinks >= live) return {{0, end}};
  std::vector<std::pair<uint64_t, uint64_t>> out;
  if (sinks > 0) out.push_back({0, sinks});
  out.push_back({live, end});
  return out;
}

}  // namespace

MatchPlan PrefixIndex::match(BlockHasher& hasher, const ReuseScope& scope,
                             std::span<const int32_t> tokens,
                             std::span<const MultimodalItem> multimodal,
                             std::span<const BlockKey> keys) const {
  MatchPlan mp;
  ReuseMatch& m = mp.match;
  m.groups.resize(plan_.cache_groups().size());
  for (const CacheGroup& g : plan_.cache_groups()) m.groups[g.id.value].policy = g.policy;
  // The last prompt token is always computed (its logits start the generation).
  const uint64_t lookup = tokens.empty() ? 0 : tokens.size() - 1;
  m.lookup_tokens = lookup;
  if (!plan_.config().enable_block_reuse || lookup == 0) return mp;
  mp.root = tree_.find(hasher.root(scope));
  if (mp.root == kNoNode) return mp;
  Matcher matcher(plan_, tree_, hasher, tokens, multimodal, keys, lookup, mp);
  matcher.walk_full_blocks();
  matcher.match_tail();
  matcher.prune_and_report();
  return mp;
}

ReuseMatch PrefixIndex::touch_reuse(const ReuseScope& scope, std::span<const int32_t> tokens,
                                    std::span<const MultimodalItem> multimodal,
                                    std::span<const BlockKey> keys) {
  MatchPlan mp = match(hasher_, scope, tokens, multimodal, keys);
  fill_reused_pages(mp);
  // Deepest first, as a release queues a path (LRU then evicts it from its end): the SSM
  // snapshots at the match's end, then the attention pages from the last block back.
  const auto touch = [&](PageId p) {
    if (p != kNoPage) storage_.touch(p);
  };
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.kind == GroupKind::kSsm) {
      for (const PageId p : mp.pages[g.id.value]) touch(p);
    }
  }
  for (uint64_t b = blocks_for(mp.match.reused_tokens, plan_.config().tokens_per_block); b-- > 0;) {
    for (const CacheGroup& g : plan_.cache_groups()) {
      const std::vector<PageId>& pages = mp.pages[g.id.value];
      if (g.kind != GroupKind::kSsm && b < pages.size()) touch(pages[b]);
    }
  }
  return mp.match;
}

MatchPlan PrefixIndex::match_and_mark_demand(const ReuseScope& scope,
                                             std::span<const int32_t> tokens,
                                             std::span<const MultimodalItem> multimodal,
                                             std::span<const BlockKey> keys) {
  MatchPlan mp = match(hasher_, scope, tokens, multimodal, keys);
  fill_reused_pages(mp);
  // Attention could reuse more than the snapshots allowed: mark the block end where a snapshot
  // would have helped, so that requests passing it (this one first) take one there.
  const uint32_t tpb = plan_.config().tokens_per_block;
  const uint64_t wanted = mp.match.hybrid_tokens / tpb;
  if (mp.match.hybrid_tokens > mp.match.reused_tokens && wanted > 0 &&
      wanted * tpb > mp.match.reused_tokens && wanted <= mp.path.size()) {
    Node& n = tree_.node(mp.path[wanted - 1]);
    if (!n.demanded) {
      n.demanded = true;
      mp.match.demand_points.push_back(wanted * tpb);
      std::sort(mp.match.demand_points.begin(), mp.match.demand_points.end());
    }
  }
  return mp;
}

}  // namespace hybridkv::prefix
