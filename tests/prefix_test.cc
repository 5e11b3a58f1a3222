// prefix/ on its own, without a manager: the key index's deletion, tree pruning, deduplication
// of offered pages, matching with hybrid pruning, and both block hashers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "memory/backend.h"
#include "prefix/prefix_index.h"

namespace hybridkv::prefix {
namespace {

using storage::kGpuTier;
using storage::PageId;
using storage::Ref;

BlockKey key_with_home(uint64_t home, uint8_t tag) {
  BlockKey k{};
  std::memcpy(k.data(), &home, sizeof(home));  // BlockKeyHash reads the first 8 bytes
  k[31] = tag;
  return k;
}

// A generator seeded from HKV_SEED (else at random), the seed printed for a replay.
std::mt19937_64 seeded_rng() {
  const char* env = std::getenv("HKV_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

TEST(KeyIndex, DeletionKeepsEveryProbeChainIntact) {
  // Keys that share a home slot form one probe chain; deleting from its middle must leave the
  // rest findable (backward-shift deletion), also across the table's wrap-around.
  KeyIndex index;
  std::vector<BlockKey> keys;
  for (uint8_t i = 0; i < 6; ++i) keys.push_back(key_with_home(1023, i));  // last slot: wraps
  for (uint8_t i = 0; i < 6; ++i) keys.push_back(key_with_home(5, i));
  for (size_t i = 0; i < keys.size(); ++i) index.insert(keys[i], NodeId(static_cast<uint32_t>(i)));
  for (size_t i : {2u, 0u, 7u, 11u}) index.erase(keys[i]);
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool erased = i == 2 || i == 0 || i == 7 || i == 11;
    EXPECT_EQ(index.find(keys[i]), erased ? kNoNode : NodeId(static_cast<uint32_t>(i))) << i;
  }
  EXPECT_EQ(index.size(), keys.size() - 4);
}

TEST(KeyIndex, RandomInsertsAndErasesAgreeWithAReferenceSet) {
  std::mt19937_64 rng = seeded_rng();
  KeyIndex index;
  std::map<BlockKey, NodeId> reference;
  for (int op = 0; op < 20000; ++op) {
    const uint64_t home = rng() % 64;  // drawn before the tag in every build
    const BlockKey k = key_with_home(home, static_cast<uint8_t>(rng() % 8));
    const auto it = reference.find(k);
    if (it == reference.end()) {
      index.insert(k, NodeId(static_cast<uint32_t>(op)));
      reference[k] = NodeId(static_cast<uint32_t>(op));
    } else {
      index.erase(k);
      reference.erase(it);
    }
  }
  for (const auto& [k, id] : reference) EXPECT_EQ(index.find(k), id);
  EXPECT_EQ(index.size(), reference.size());
}

// Growth in slices: while the doubled table is written and filled, every key stays findable
// (inserted before, during or after, erased from either table), and no call copies the table.
TEST(KeyIndex, GrowsInSlicesWithEveryKeyFindableThroughout) {
  std::mt19937_64 rng = seeded_rng();
  KeyIndex index;
  std::map<BlockKey, NodeId> reference;
  std::vector<BlockKey> keys;  // every key ever inserted (erased ones included)
  size_t growths = 0, checks_while_growing = 0;
  bool was_growing = false;
  for (uint32_t op = 0; op < 60000; ++op) {
    const bool erase = !reference.empty() && rng() % 4 == 0;
    if (erase) {
      const BlockKey k = keys[rng() % keys.size()];
      if (const auto it = reference.find(k); it != reference.end()) {
        index.erase(k);
        reference.erase(it);
      }
    } else {
      BlockKey k = key_with_home(rng(), static_cast<uint8_t>(rng() % 4));
      if (reference.count(k) == 0) {
        index.insert(k, NodeId(op));
        reference[k] = NodeId(op);
        keys.push_back(k);
      }
    }
    // The table inserts go to never fills past half, even while the old one is copied.
    ASSERT_LE(index.size() * 2, index.capacity()) << "op " << op;
    if (index.growing() && rng() % 16 == 0) {  // a sample of keys, mid-growth
      ++checks_while_growing;
      for (int i = 0; i < 32; ++i) {
        const BlockKey& k = keys[rng() % keys.size()];
        const auto it = reference.find(k);
        ASSERT_EQ(index.find(k), it == reference.end() ? kNoNode : it->second) << "op " << op;
      }
    }
    if (was_growing && !index.growing()) ++growths;
    was_growing = index.growing();
  }
  EXPECT_GE(growths, 5u);  // 1,024 slots grown to 65,536 at least
  EXPECT_GT(checks_while_growing, 100u);
  for (const BlockKey& k : keys) {
    const auto it = reference.find(k);
    EXPECT_EQ(index.find(k), it == reference.end() ? kNoNode : it->second);
  }
  EXPECT_EQ(index.size(), reference.size());
}

TEST(RadixTree, PruningRemovesEmptyUnpinnedNodesUpToTheFirstKeptOne) {
  RadixTree tree(1);
  const NodeId root = tree.root(key_with_home(1, 0));
  const std::vector<int32_t> tokens(4, 1);
  const NodeId a = tree.add(root, key_with_home(2, 0), tokens, true);
  const NodeId b = tree.add(a, key_with_home(3, 0), tokens, true);
  const NodeId c = tree.add(b, key_with_home(4, 0), tokens, true);
  const NodeId side = tree.add(a, key_with_home(5, 0), tokens, true);
  tree.node(b).pins = 1;
  tree.prune(c);  // c goes; b is pinned and stays
  EXPECT_EQ(tree.find(key_with_home(4, 0)), kNoNode);
  EXPECT_EQ(tree.find(key_with_home(3, 0)), b);
  tree.node(b).pins = 0;
  tree.prune(b);  // b goes; a keeps its other child
  EXPECT_EQ(tree.find(key_with_home(3, 0)), kNoNode);
  EXPECT_EQ(tree.find(key_with_home(2, 0)), a);
  tree.prune(side);  // side, then a, go; the root is pinned for ever
  EXPECT_EQ(tree.find(key_with_home(2, 0)), kNoNode);
  EXPECT_EQ(tree.find(key_with_home(1, 0)), root);
  EXPECT_EQ(tree.size(), 1u);
}

// A parent keeps each child's first token and size beside the child (a match's tail scans
// them instead of the children's nodes); pruning a child moves the last one into its place.
TEST(RadixTree, EachChildsHeadStaysBesideItThroughPruning) {
  RadixTree tree(1);
  const NodeId root = tree.root(key_with_home(1, 0));
  std::vector<NodeId> kids;
  for (int32_t i = 0; i < 6; ++i) {
    const std::vector<int32_t> tokens(static_cast<size_t>(1 + i % 4), 10 + i);
    kids.push_back(tree.add(root, key_with_home(10 + i, 0), tokens, tokens.size() == 4));
  }
  auto heads_agree = [&] {
    const Node& r = tree.node(root);
    if (r.heads.size() != r.children.size()) return false;
    for (size_t i = 0; i < r.children.size(); ++i) {
      const Node& c = tree.node(r.children[i]);
      if (r.heads[i].first_token != c.tokens[0] || r.heads[i].tokens != c.tokens.size())
        return false;
    }
    return true;
  };
  EXPECT_TRUE(heads_agree());
  tree.prune(kids[1]);  // the last child takes its place
  tree.prune(kids[5]);  // ... and then leaves too
  EXPECT_TRUE(heads_agree());
  EXPECT_EQ(tree.node(root).children.size(), 4u);
  tree.add(root, key_with_home(30, 0), std::vector<int32_t>{77, 1}, false);  // a reused id
  EXPECT_TRUE(heads_agree());
}

// An SSM layer and a full-attention layer, tokens_per_block 4, none backend.
class PrefixIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ManagerConfig c;
    c.tokens_per_block = 4;
    SsmLayerConfig ssm;
    ssm.id = 0;
    ssm.buffers = {{"ssm_state", 4096, {}, {}}};
    AttentionLayerConfig full;
    full.id = 1;
    full.buffers = {{"key", 1024, {}, {}}, {"value", 1024, {}, {}}};
    c.ssm_layers.push_back(ssm);
    c.attention_layers.push_back(full);
    if (optional_layer_) {
      AttentionLayerConfig optional = full;
      optional.id = 2;
      optional.reuse_policy = ReusePolicy::kOptional;
      c.attention_layers.push_back(optional);
      c.enable_partial_reuse = true;
      c.pool_ratio = std::vector<double>{1.0, 1.0};  // room for a few snapshots
    }
    c.policies.upkeep_between_steps = upkeep_between_steps_;
    c.tiers = {{TierKind::kGpu, 4ull << 20, ""}};
    if (host_bytes_ > 0) c.tiers.push_back({TierKind::kHost, host_bytes_, ""});
    plan_ = std::make_unique<StoragePlan>(*StoragePlan::build(c));
    backend_ = std::move(memory::make_backend({BackendKind::kNone})).value();
    ASSERT_TRUE(backend_->allocate(*plan_).is_ok());
    storage_ = std::make_unique<storage::Storage>(*plan_, backend_.get());
    index_ = std::make_unique<PrefixIndex>(*plan_, *storage_);
    ssm_ = *plan_->buffer_group_id(0, "ssm_state");
    attn_ = *plan_->buffer_group_id(1, "key");
    if (optional_layer_) optional_ = *plan_->buffer_group_id(2, "key");
  }
  // Commits `blocks` full blocks of tokens 0, 1, 2, ... with attention pages, and snapshots at
  // the ends of the blocks listed.
  void commit(uint64_t blocks, std::vector<uint64_t> snapshots_after) {
    NodeId parent = index_->root({});
    for (uint64_t b = 0; b < blocks; ++b) {
      const NodeId node = index_->block_node(parent, std::span(tokens_).subspan(b * 4, 4), b * 4,
                                             {}, /*full=*/true);
      index_->publish(node, attn_, storage_->allocate(attn_, kGpuTier), 4);
      if (std::find(snapshots_after.begin(), snapshots_after.end(), b) != snapshots_after.end())
        index_->publish(node, ssm_, storage_->allocate(ssm_, kGpuTier), 4);
      parent = node;
    }
  }

  // The nodes of the first `n` full blocks of tokens_ (created where missing).
  std::vector<NodeId> path(size_t n) {
    std::vector<NodeId> blocks;
    for (NodeId parent = index_->root({}); blocks.size() < n; parent = blocks.back())
      blocks.push_back(index_->block_node(parent, std::span(tokens_).subspan(blocks.size() * 4, 4),
                                          blocks.size() * 4, {}, true));
    return blocks;
  }
  // The page counts as just used.
  void touch(PageId page) {
    storage_->add_ref(page, Ref::kActive);
    storage_->drop_ref(page, Ref::kActive);
  }

  std::vector<int32_t> tokens_ = [] {
    std::vector<int32_t> t(64);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i);
    return t;
  }();
  uint64_t host_bytes_ = 0;      // a host tier under the GPU when set
  bool optional_layer_ = false;  // an OPTIONAL full-attention layer 2, and partial reuse
  bool upkeep_between_steps_ = false;
  std::unique_ptr<StoragePlan> plan_;
  std::unique_ptr<memory::MemoryBackend> backend_;
  std::unique_ptr<storage::Storage> storage_;
  std::unique_ptr<PrefixIndex> index_;
  CacheGroupId ssm_, attn_, optional_;
};

TEST_F(PrefixIndexTest, MatchIsPrunedBackToTheLastSnapshot) {
  commit(6, {1, 3});  // KV for 24 tokens, snapshots after 8 and 16
  BlockHasher hasher(BlockHash::kSha256);
  const ReuseMatch m = index_->match(hasher, {}, std::span(tokens_).first(30), {}).match;
  EXPECT_EQ(m.lookup_tokens, 29u);
  EXPECT_EQ(m.divergence_tokens, 24u);  // six full blocks found by key
  EXPECT_EQ(m.hybrid_tokens, 24u);      // attention covers all of them
  EXPECT_EQ(m.reused_tokens, 16u);      // the SSM can only restore at its snapshot after 16
  EXPECT_EQ(index_->check(), "");
}

// What a match lost to snapshots that were there and left (the sim's "reuse lost" line).
TEST_F(PrefixIndexTest, AMatchReportsWhatDroppedSnapshotsWouldHaveAdded) {
  commit(6, {1, 3});  // KV for 24 tokens, snapshots after 8 and 16
  BlockHasher hasher(BlockHash::kSha256);
  auto match = [&] { return index_->match(hasher, {}, std::span(tokens_).first(30), {}).match; };
  EXPECT_EQ(match().reused_tokens, 16u);
  EXPECT_EQ(match().dropped_snapshot_tokens, 0u);  // 16 -> 24 never had a snapshot
  // Both snapshots are evicted; the KV stays.
  const PoolGroupId pg = plan_->cache_group(ssm_).page_pool_group(true);
  storage::make_room(*storage_, kGpuTier, pg, storage_->counts(kGpuTier, pg).total, *index_);
  const ReuseMatch m = match();
  EXPECT_EQ(m.reused_tokens, 0u);
  EXPECT_EQ(m.hybrid_tokens, 24u);
  EXPECT_EQ(m.dropped_snapshot_tokens, 16u);  // up to the deepest dropped one, not past it
  EXPECT_EQ(index_->check(), "");
}

// A full-attention block dropped from the tree takes the KV below it along (no match reaches
// it); the snapshots below stay and serve again once a request computes the block again.
TEST_F(PrefixIndexTest, DroppingAKvBlockDropsTheKvBelowItAndKeepsTheSnapshots) {
  commit(6, {1, 5});  // KV for 24 tokens, snapshots after 8 and 24
  const std::vector<NodeId> blocks = path(6);
  // Every KV page but block 2's is used again, so block 2's is the next one evicted.
  for (size_t b : {0u, 1u, 3u, 4u, 5u}) touch(index_->tree().pages(blocks[b])[attn_.value].page);
  const PoolGroupId pg = plan_->cache_group(attn_).pool_group;
  storage::make_room(*storage_, kGpuTier, pg, storage_->counts(kGpuTier, pg).free + 1, *index_);
  for (size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_EQ(index_->holds(blocks[b], attn_), b < 2) << "block " << b;  // 3..5 went with 2
    EXPECT_EQ(index_->holds(blocks[b], ssm_), b == 1 || b == 5) << "block " << b;
  }
  EXPECT_EQ(index_->stats().groups[attn_.value].orphans_dropped, 3u);
  BlockHasher hasher(BlockHash::kSha256);
  auto match = [&] { return index_->match(hasher, {}, std::span(tokens_).first(30), {}).match; };
  EXPECT_EQ(match().reused_tokens, 8u);
  // A request computes blocks 2..5 again and publishes their KV, no snapshot.
  for (size_t b = 2; b < blocks.size(); ++b)
    index_->publish(blocks[b], attn_, storage_->allocate(attn_, kGpuTier), 4);
  EXPECT_EQ(match().reused_tokens, 24u);  // the snapshot after 24 serves again
  EXPECT_EQ(index_->check(), "");
  EXPECT_EQ(storage_->check(), "");
}

// KV a request still uses stays when a block above it is dropped, under a node left with no KV.
// Once released it is an orphan too: the next block dropped above reaches it through that node.
TEST_F(PrefixIndexTest, AnOrphanLeftInUseGoesWithTheNextBlockDroppedAboveIt) {
  commit(6, {5});
  const std::vector<NodeId> blocks = path(6);
  auto kv = [&](size_t b) { return index_->tree().pages(blocks[b])[attn_.value].page; };
  const std::vector<PageId> in_use{kv(3), kv(4), kv(5)};
  for (PageId p : in_use) storage_->add_ref(p, Ref::kActive);
  const PoolGroupId pg = plan_->cache_group(attn_).pool_group;
  for (size_t b : {0u, 1u}) touch(kv(b));
  storage::make_room(*storage_, kGpuTier, pg, storage_->counts(kGpuTier, pg).free + 1,
                     *index_);  // block 2 goes
  for (size_t b = 0; b < blocks.size(); ++b)
    EXPECT_EQ(index_->holds(blocks[b], attn_), b != 2) << "block " << b;
  EXPECT_EQ(index_->check(), "");
  for (PageId p : in_use) storage_->drop_ref(p, Ref::kActive);
  touch(kv(0));
  storage::make_room(*storage_, kGpuTier, pg, storage_->counts(kGpuTier, pg).free + 1,
                     *index_);  // block 1 goes
  for (size_t b = 0; b < blocks.size(); ++b)
    EXPECT_EQ(index_->holds(blocks[b], attn_), b == 0) << "block " << b;
  EXPECT_TRUE(index_->holds(blocks[5], ssm_));
  EXPECT_EQ(index_->stats().groups[attn_.value].orphans_dropped, 3u);
  EXPECT_EQ(index_->check(), "");
  EXPECT_EQ(storage_->check(), "");
}

class PrefixIndexTwoTiers : public PrefixIndexTest {
 protected:
  PrefixIndexTwoTiers() { host_bytes_ = 16 << 10; }
};

class PrefixIndexUpkeepBetweenSteps : public PrefixIndexTest {
 protected:
  PrefixIndexUpkeepBetweenSteps() { upkeep_between_steps_ = true; }
};

class PrefixIndexWithOptional : public PrefixIndexTest {
 protected:
  PrefixIndexWithOptional() { optional_layer_ = true; }
};

// A match cut inside its full path (no snapshot past block 0) is served by a partial sibling of
// block 1; the OPTIONAL group's coverage is the winner's, not that of the last sibling tried.
// (Found by RandomizedReuse under ASan, CI of 2026-12-02: the OPTIONAL coverage of the last
// sibling tried was reported over the winner's path, which had no OPTIONAL page in its tail;
// the request then read a page nobody wrote.)
TEST_F(PrefixIndexWithOptional, APartialSiblingReportsItsOwnOptionalCoverage) {
  commit(4, {0});  // KV for 16 tokens, a snapshot after 4 only; no OPTIONAL page past block 0
  const NodeId block0 = path(1)[0];
  index_->publish(block0, optional_, storage_->allocate(optional_, kGpuTier), 4);
  // Two shorter commits of the same tokens under block 0: tokens 4..6 (KV and a snapshot, no
  // OPTIONAL page) and tokens 4..5 (KV, snapshot and OPTIONAL page).
  auto partial = [&](uint64_t n, bool optional) {
    const NodeId node = index_->block_node(block0, std::span(tokens_).subspan(4, n), 4, {},
                                           /*full=*/false);
    const auto k = static_cast<uint32_t>(n);
    index_->publish(node, attn_, storage_->allocate(attn_, kGpuTier), k);
    index_->publish(node, ssm_, storage_->allocate(ssm_, kGpuTier), k);
    if (optional) index_->publish(node, optional_, storage_->allocate(optional_, kGpuTier), k);
  };
  partial(3, false);
  partial(2, true);
  BlockHasher hasher(BlockHash::kSha256);
  const ReuseMatch m = index_->match(hasher, {}, std::span(tokens_).first(17), {}).match;
  EXPECT_EQ(m.divergence_tokens, 16u);
  EXPECT_EQ(m.reused_tokens, 7u);  // the 3-token sibling's snapshot
  const GroupReuse& opt = m.groups[optional_.value];
  EXPECT_EQ(opt.coverage, 4u);  // block 0's page only: the winner has no OPTIONAL page
  EXPECT_FALSE(opt.complete);   // so OPTIONAL cannot be restored at 7
  EXPECT_EQ(index_->check(), "");
}

// The GPU's victim goes down to a full host, whose own victim is a block above it: that
// block's loss orphans the KV below it, the victim on its way down among it. The victim arrives
// on the host; the other orphans go.
TEST_F(PrefixIndexTwoTiers, AVictimOnItsWayDownStaysWhenTheHostDropsTheBlockAboveIt) {
  const PoolGroupId pg = plan_->cache_group(attn_).pool_group;
  const storage::TierIndex host(1);
  const uint64_t h = storage_->counts(host, pg).total;
  ASSERT_GE(h, 2u);
  ASSERT_LE((h + 2) * 4, tokens_.size());
  const std::vector<NodeId> blocks = path(h + 2);
  // A snapshot at the end first, so no KV is demoted; then the KV, oldest first: blocks 0 ..
  // h - 1 fill the host, h and h + 1 are on the GPU.
  index_->publish(blocks.back(), ssm_, storage_->allocate(ssm_, kGpuTier), 4);
  for (size_t b = 0; b < blocks.size(); ++b)
    index_->publish(blocks[b], attn_, storage_->allocate(attn_, b < h ? host : kGpuTier), 4);
  storage::make_room(*storage_, kGpuTier, pg, storage_->counts(kGpuTier, pg).free + 1, *index_);
  EXPECT_EQ(storage_->check(), "");
  EXPECT_EQ(index_->check(), "");
  for (size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_EQ(index_->holds(blocks[b], attn_), b == h) << "block " << b;
  }
  EXPECT_EQ(storage_->page(index_->tree().pages(blocks[h])[attn_.value].page).tier,
            TierKind::kHost);
  EXPECT_EQ(index_->stats().groups[attn_.value].orphans_dropped, h);  // 1 .. h - 1 and h + 1
}

// A snapshot dropped to make room leaves its walks up the path for tidy(): until then the KV run
// it served counts as resumable and the snapshot it superseded stays demoted, the node stays
// (pinned, no page), and the counts check out; tidy() demotes the run, promotes the snapshot
// above and prunes. A snapshot published at the node in between keeps superseding.
TEST_F(PrefixIndexUpkeepBetweenSteps, ADroppedSnapshotsWalksWaitForTidy) {
  commit(4, {1, 3});  // KV on blocks 0..3, snapshots after blocks 1 and 3
  const std::vector<NodeId> blocks = path(4);
  auto kv_demoted = [&](size_t b) {
    return storage_->page(index_->tree().pages(blocks[b])[attn_.value].page).demoted;
  };
  auto snapshot = [&](size_t b) { return index_->tree().pages(blocks[b])[ssm_.value].page; };
  EXPECT_TRUE(storage_->page(snapshot(1)).demoted);  // superseded by the one after block 3
  auto drop_snapshot = [&](size_t b) {
    const PageId page = snapshot(b);
    index_->page_dropping(page, blocks[b].value, ssm_);
    storage_->drop_owned(page);
  };
  drop_snapshot(3);
  EXPECT_EQ(index_->untidy(), 1u);
  EXPECT_EQ(snapshot(3), storage::kNoPage);
  EXPECT_FALSE(kv_demoted(2));
  EXPECT_FALSE(kv_demoted(3));
  EXPECT_TRUE(storage_->page(snapshot(1)).demoted);
  EXPECT_EQ(index_->check(), "");
  EXPECT_EQ(index_->tidy(), 1u);
  EXPECT_EQ(index_->untidy(), 0u);
  EXPECT_FALSE(kv_demoted(1));
  EXPECT_TRUE(kv_demoted(2));  // past the deepest snapshot now
  EXPECT_TRUE(kv_demoted(3));
  EXPECT_FALSE(storage_->page(snapshot(1)).demoted);
  EXPECT_EQ(index_->check(), "");

  // Published again before the tidy: the one after block 3 still supersedes block 1's.
  index_->publish(blocks[3], ssm_, storage_->allocate(ssm_, kGpuTier), 4);
  drop_snapshot(3);
  index_->publish(blocks[3], ssm_, storage_->allocate(ssm_, kGpuTier), 4);
  EXPECT_EQ(index_->tidy(), 1u);
  EXPECT_TRUE(storage_->page(snapshot(1)).demoted);
  EXPECT_FALSE(kv_demoted(3));
  EXPECT_EQ(index_->check(), "");

  // A node whose pages all went is pruned by the tidy, not before.
  drop_snapshot(3);
  const PageId kv = index_->tree().pages(blocks[3])[attn_.value].page;
  index_->page_dropping(kv, blocks[3].value, attn_);
  storage_->drop_owned(kv);
  EXPECT_NE(index_->find(index_->tree().node(blocks[3]).key), kNoNode);
  EXPECT_EQ(index_->tidy(), 1u);
  EXPECT_EQ(index_->find(index_->tree().node(blocks[3]).key), kNoNode);
  EXPECT_EQ(index_->check(), "");
}

// At most kMaxUntidy drops wait: one more tidies the oldest.
TEST_F(PrefixIndexUpkeepBetweenSteps, UntidyDropsAreBounded) {
  const NodeId root = index_->root({});
  const size_t n = PrefixIndex::kMaxUntidy + 3;
  const size_t blocks = index_->tree().size();
  std::vector<BlockKey> keys;       // a pruned node's id is taken again
  for (size_t i = 0; i < n; ++i) {  // one snapshot at a time: the GPU holds few
    const std::vector<int32_t> t{static_cast<int32_t>(1000 + i), 1, 2, 3};
    const NodeId node = index_->block_node(root, t, 0, {}, true);
    keys.push_back(index_->tree().node(node).key);
    const PageId page = storage_->allocate(ssm_, kGpuTier);
    index_->publish(node, ssm_, page, 4);
    index_->page_dropping(page, node.value, ssm_);
    storage_->drop_owned(page);
    EXPECT_EQ(index_->untidy(), std::min(i + 1, PrefixIndex::kMaxUntidy));
  }
  for (size_t i = 0; i < n; ++i)  // the oldest three were tidied and pruned
    EXPECT_EQ(index_->find(keys[i]) == kNoNode, i < 3) << "node " << i;
  EXPECT_EQ(index_->check(), "");
  EXPECT_EQ(index_->tidy(), PrefixIndex::kMaxUntidy);
  EXPECT_EQ(index_->tree().size(), blocks);
  EXPECT_EQ(index_->check(), "");
}

// The tail of a match is the committed partial block the lookup ends on, found among many
// siblings, several of them sharing its first token; dropping one sibling keeps the others
// findable (their heads move with them).
TEST_F(PrefixIndexTest, ATailIsFoundAmongSiblingsThatShareItsFirstToken) {
  const NodeId root = index_->root({});
  auto commit_block = [&](const std::vector<int32_t>& t, bool snapshot = true) {
    const NodeId node = index_->block_node(root, t, 0, {}, t.size() == 4);
    const auto n = static_cast<uint32_t>(t.size());
    index_->publish(node, attn_, storage_->allocate(attn_, kGpuTier), n);
    if (snapshot) index_->publish(node, ssm_, storage_->allocate(ssm_, kGpuTier), n);
    return node;
  };
  for (int32_t i = 0; i < 8; ++i) commit_block({100 + i, 1, 2, 3}, false);  // other first tokens
  const NodeId nine = commit_block({7, 8, 9});
  commit_block({7, 8});
  commit_block({7, 5, 6});
  BlockHasher hasher(BlockHash::kSha256);
  auto reused = [&](std::vector<int32_t> prompt) {  // the lookup leaves out the last token
    return index_->match(hasher, {}, prompt, {}).match.reused_tokens;
  };
  EXPECT_EQ(reused({7, 8, 9, 0}), 3u);
  EXPECT_EQ(reused({7, 8, 0}), 2u);
  EXPECT_EQ(reused({7, 5, 6, 0}), 3u);
  EXPECT_EQ(reused({6, 8, 9, 0}), 0u);
  // {7, 8, 9} leaves the tree: the last sibling takes its place among the root's children.
  for (const CacheGroupId g : {attn_, ssm_}) {  // as an eviction drops them
    const PageId page = index_->tree().pages(nine)[g.value].page;
    index_->page_dropping(page, nine.value, g);
    storage_->drop_owned(page);
  }
  EXPECT_EQ(index_->untidy(), 0u);  // without upkeep between steps, the drop did its walks
  EXPECT_EQ(index_->find(index_->tree().node(nine).key), kNoNode);
  EXPECT_EQ(index_->check(), "");
  EXPECT_EQ(reused({7, 8, 9, 0}), 0u);  // no committed endpoint at 3 any more
  EXPECT_EQ(reused({7, 8, 0}), 2u);
  EXPECT_EQ(reused({7, 5, 6, 0}), 3u);
}

TEST_F(PrefixIndexTest, OffersAreDeduplicatedAgainstTheTree) {
  commit(1, {});
  const NodeId node =
      index_->block_node(index_->root({}), std::span(tokens_).first(4), 0, {}, true);
  const PageId own = storage_->allocate(attn_, kGpuTier);
  storage_->add_ref(own, Ref::kActive);
  // The block holds an equal, complete page on the GPU: the cache adopts it.
  const Offer offer = index_->offer(node, attn_, own, 4);
  EXPECT_EQ(offer.result, OfferResult::kAdopt);
  EXPECT_NE(offer.tree_page, own);
  // A block with no page of the group takes the offered one.
  const PageId snap = storage_->allocate(ssm_, kGpuTier);
  storage_->add_ref(snap, Ref::kActive);
  EXPECT_EQ(index_->offer(node, ssm_, snap, 4).result, OfferResult::kPublished);
  EXPECT_EQ(storage_->page(snap).owner, node.value);
  EXPECT_EQ(index_->check(), "");
}

TEST_F(PrefixIndexTest, ADroppedPageLeavesTheTreeAndEmptyNodesArePruned) {
  commit(2, {});
  EXPECT_EQ(index_->tree().size(), 3u);  // root and two blocks
  // Evicting everything (one tier: DROPPABLE pages are dropped) empties the tree.
  const PoolGroupId pg = plan_->cache_group(attn_).pool_group;
  storage::make_room(*storage_, kGpuTier, pg, storage_->counts(kGpuTier, pg).total, *index_);
  EXPECT_EQ(index_->tree().size(), 1u);
  EXPECT_EQ(index_->check(), "");
  EXPECT_EQ(storage_->check(), "");
}

TEST(BlockHasher, BothKindsChainParentKeysAndSeparateScopes) {
  for (BlockHash kind : {BlockHash::kSha256, BlockHash::kFastNonCryptographic}) {
    BlockHasher h(kind);
    const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
    const BlockKey root = h.root({});
    EXPECT_EQ(h.key(root, a), h.key(root, a));            // deterministic
    EXPECT_NE(h.key(root, a), h.key(root, b));            // tokens matter
    EXPECT_NE(h.key(root, a), h.key(h.key(root, a), a));  // the parent matters
    ReuseScope salted;
    salted.salt = 7;
    EXPECT_NE(h.root({}), h.root(salted));  // scopes never share keys
    const std::array<uint8_t, 32> digest{9};
    EXPECT_NE(h.key(root, a), h.key(root, a, std::span(&digest, 1)));  // multimodal items count
  }
  BlockHasher sha(BlockHash::kSha256), fast(BlockHash::kFastNonCryptographic);
  const std::vector<int32_t> a = {1, 2, 3, 4};
  EXPECT_NE(sha.key(sha.root({}), a), fast.key(fast.root({}), a));  // different functions
}

}  // namespace
}  // namespace hybridkv::prefix
