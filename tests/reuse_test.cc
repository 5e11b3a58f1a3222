// Prefix reuse through the fake engine: reused pages hold exactly what computing would have
// written, snapshots decide what hybrid requests reuse, and shared pages never change.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <thread>

#include "lifecycle_fixture.h"
#include "prefix/block_hash.h"

namespace hybridkv {
namespace {

using testing::advance;
using testing::commit_computed;
using testing::LifecycleModel;
using testing::make_manager;
using testing::make_request;
using testing::random_tokens;
using testing::Request;
using testing::resume_compute_commit;

constexpr CacheGroupId kSsm(0), kPrivate(1), kFull(2), kWindow(3);

class Reuse : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{42};
};

// Digest of every byte of a slot of every pool of a pool group, for "never written" checks.
uint64_t slot_digest(const KvCacheManager& m, TierKind tier, PoolGroupId pg, uint32_t slot) {
  uint64_t h = 1469598103934665603ull;
  const PoolGroup& group = m.plan().pool_group(pg);
  for (uint32_t p = 0; p < group.pools.size(); ++p) {
    std::vector<std::byte> bytes(group.pools[p].slot_bytes);
    testing::read_pool_bytes(m, bytes.data(), m.slot_address(tier, pg, p, slot), bytes.size());
    for (std::byte b : bytes) h = (h ^ static_cast<uint8_t>(b)) * 1099511628211ull;
  }
  return h;
}

TEST_F(Reuse, ReusedPrefixHoldsWhatComputingWouldHaveWritten) {
  LifecycleModel model;
  model.partial_reuse = true;  // B takes A's partial tail block too
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 300);
  Request a = make_request(*m, tokens, 200);
  EXPECT_EQ(a.cache->reuse_match().reused_tokens, 0u);
  ASSERT_OK(resume_compute_commit(engine, a, 200));
  ASSERT_OK(a.cache->close());

  // B's prompt extends A's: it reuses A's 200 tokens (full blocks, the partial tail and the
  // snapshot at 200), and the fake engine finds exactly the bytes it would have computed.
  (void)m->take_iteration_stats();
  Request b = make_request(*m, tokens, 250);
  const ReuseMatch match = b.cache->reuse_match();
  EXPECT_EQ(match.lookup_tokens, 249u);
  EXPECT_EQ(match.reused_tokens, 200u);
  EXPECT_EQ(b.cache->history(), 200u);
  ASSERT_OK(b.cache->resume({}));
  const IterationStats copies = m->take_iteration_stats();
  EXPECT_EQ(copies.device_copies, 3u);  // the partial tail (full + window groups) and the state
  ASSERT_OK(engine.verify(*b.cache, b.fake));
  ASSERT_OK(advance(engine, b, 250));
  ASSERT_OK(advance(engine, b, 300));

  // C computes everything itself in another scope: the same bytes by construction, checked.
  Request c = make_request(*m, tokens, 250, 1, ReuseScope{7, {}});
  EXPECT_EQ(c.cache->reuse_match().reused_tokens, 0u);
  ASSERT_OK(c.cache->resume({}));
  ASSERT_OK(advance(engine, c, 300));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, SharedPagesNeverChangeWhileShared) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 400);
  Request a = make_request(*m, tokens, 160);
  ASSERT_OK(resume_compute_commit(engine, a, 160));
  const std::vector<int32_t> a_table(a.cache->block_table(kFull)->begin(),
                                     a.cache->block_table(kFull)->end());
  std::map<int32_t, uint64_t> before;
  for (int32_t slot : a_table) before[slot] = slot_digest(*m, TierKind::kGpu, PoolGroupId(2), slot);
  // B shares them and computes 240 more tokens on top.
  Request b = make_request(*m, tokens, 400);
  ASSERT_EQ(b.cache->reuse_match().reused_tokens, 160u);
  ASSERT_OK(b.cache->resume({}));
  for (uint64_t t = 170; t <= 399; t += 23) ASSERT_OK(advance(engine, b, t));
  const auto b_table = b.cache->block_table(kFull);
  for (size_t i = 0; i < a_table.size(); ++i) EXPECT_EQ((*b_table)[i], a_table[i]);  // shared
  for (const auto& [slot, digest] : before) {
    EXPECT_EQ(slot_digest(*m, TierKind::kGpu, PoolGroupId(2), slot), digest) << "slot " << slot;
  }
  ASSERT_OK(engine.verify(*a.cache, a.fake));
}

// Without partial reuse no partial block is reused anywhere, not even a committed tail that
// matches whole: B finds A's 12 full blocks (192 tokens) but not the 8-token tail to 200, and
// with A's only snapshot at 200 the state cannot be restored earlier: nothing is reused.
TEST_F(Reuse, WithoutPartialReuseNoPartialBlockIsReused) {
  auto m = make_manager(LifecycleModel{});  // partial_reuse false
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 300);
  Request a = make_request(*m, tokens, 200);
  ASSERT_OK(resume_compute_commit(engine, a, 200));
  ASSERT_OK(a.cache->close());
  Request b = make_request(*m, tokens, 250);
  const ReuseMatch match = b.cache->reuse_match();
  EXPECT_EQ(match.divergence_tokens, 192u);
  EXPECT_EQ(match.hybrid_tokens, 192u);
  EXPECT_EQ(match.reused_tokens, 0u);
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(advance(engine, b, 250));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, MultiTurnReusesUpToEachSnapshot) {
  LifecycleModel model;        // tokens_per_block 16, commit_min_snapshot
  model.partial_reuse = true;  // later turns end inside a block
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> conversation = random_tokens(rng_, 40);
  const std::pair<size_t, uint64_t> turns[] = {{10, 0}, {20, 10}, {25, 20}};
  for (const auto& [length, expected] : turns) {
    SCOPED_TRACE(length);
    std::vector<int32_t> prompt(conversation.begin(), conversation.begin() + length);
    Request r = make_request(*m, prompt, length);
    EXPECT_EQ(r.cache->reuse_match().reused_tokens, expected);
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(advance(engine, r, length));
    ASSERT_OK(r.cache->resize(length, length));
    ASSERT_OK(commit_computed(r, /*is_end=*/true));
    ASSERT_OK(r.cache->close());
    EXPECT_EQ(testing::check_invariants(*m), "");
  }
  // The 10-token partial block keeps its snapshot after turn 2 filled block 0.
  std::vector<int32_t> eleven(conversation.begin(), conversation.begin() + 11);
  EXPECT_EQ(m->probe_reuse({}, eleven).reused_tokens, 10u);
  const ReuseStats stats = m->reuse_stats();
  EXPECT_EQ(stats.groups[kSsm.value].lookups, 3u);
  EXPECT_EQ(stats.groups[kSsm.value].hits, 2u);
  EXPECT_EQ(stats.groups[kSsm.value].reused_tokens, 30u);
  EXPECT_EQ(stats.groups[kSsm.value].unaligned_snapshot_hits, 2u);
  EXPECT_EQ(stats.groups[kPrivate.value].lookups, 0u);  // PRIVATE is never matched
}

TEST_F(Reuse, ForkReusesOnlySnapshotsAtOrBeforeItsDivergence) {
  LifecycleModel model;
  model.partial_reuse = true;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> trunk = random_tokens(rng_, 100);
  Request a = make_request(*m, trunk, 64);
  ASSERT_OK(a.cache->resume({}));
  for (uint64_t t = 16; t <= 64; t += 16) {  // a snapshot at every block boundary
    ASSERT_OK(advance(engine, a, t));
    ASSERT_OK(a.cache->resize(t, t));
    ASSERT_OK(commit_computed(a));
  }
  // The fork shares 40 tokens, then differs.
  std::vector<int32_t> fork(trunk.begin(), trunk.begin() + 60);
  fork[40] += 1;
  Request b = make_request(*m, fork, 60);
  const ReuseMatch match = b.cache->reuse_match();
  EXPECT_EQ(match.lookup_tokens, 59u);
  EXPECT_EQ(match.divergence_tokens, 40u);  // two full blocks and 8 tokens of the third
  EXPECT_EQ(match.hybrid_tokens, 40u);      // attention could take all 40
  EXPECT_EQ(match.reused_tokens, 32u);      // the last snapshot at or before 40
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(advance(engine, b, 60));
  // Without partial reuse the divergence stops at the last full block.
  ASSERT_OK(b.cache->close());
  ASSERT_OK(a.cache->close());
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, BackoffTrimsTheMatch) {
  LifecycleModel model;
  model.backoff = 20;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 64);
  ASSERT_OK(a.cache->resume({}));
  for (uint64_t t = 16; t <= 64; t += 16) {
    ASSERT_OK(advance(engine, a, t));
    ASSERT_OK(a.cache->resize(t, t));
    ASSERT_OK(commit_computed(a));
  }
  const ReuseMatch match = m->probe_reuse({}, tokens);
  EXPECT_EQ(match.divergence_tokens, 64u);
  EXPECT_EQ(match.hybrid_tokens, 44u);
  EXPECT_EQ(match.reused_tokens, 32u);
}

TEST_F(Reuse, ScopesNeverShareAndKeysDoNotDependOnTheContainer) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 50);
  Request a = make_request(*m, tokens, 48, 1, ReuseScope{1, 2});
  ASSERT_OK(resume_compute_commit(engine, a, 48));
  EXPECT_EQ(m->probe_reuse(ReuseScope{1, 2}, tokens).reused_tokens, 48u);
  EXPECT_EQ(m->probe_reuse(ReuseScope{1, {}}, tokens).reused_tokens, 0u);
  EXPECT_EQ(m->probe_reuse(ReuseScope{{}, 2}, tokens).reused_tokens, 0u);
  EXPECT_EQ(m->probe_reuse(ReuseScope{}, tokens).reused_tokens, 0u);

  prefix::BlockHasher hasher(BlockHash::kSha256);
  const BlockKey root = hasher.root({});
  std::array<int32_t, 16> array;
  std::copy(tokens.begin(), tokens.begin() + 16, array.begin());
  std::vector<int32_t> longer(tokens.begin(), tokens.begin() + 40);
  const BlockKey from_vector = hasher.key(root, std::span<const int32_t>(tokens).first(16));
  EXPECT_EQ(hasher.key(root, array), from_vector);
  EXPECT_EQ(hasher.key(root, std::span<const int32_t>(longer).subspan(0, 16)), from_vector);
  EXPECT_NE(hasher.key(hasher.root({1, {}}), array), from_vector);
  // A multimodal digest changes the key.
  std::array<uint8_t, 32> digest{};
  digest[0] = 1;
  const std::array<std::array<uint8_t, 32>, 1> digests = {digest};
  EXPECT_NE(hasher.key(root, array, digests), from_vector);
  // SHA-256 of the empty root tag is stable across runs: keys are reproducible.
  EXPECT_EQ(hasher.root({}), prefix::BlockHasher(BlockHash::kSha256).root({}));
}

TEST_F(Reuse, MultimodalItemsMustMatchToShare) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 50);
  CacheOptions o;
  o.input_tokens = tokens;
  o.multimodal.push_back({20, {}});
  o.multimodal[0].digest[5] = 9;
  Request a;
  a.cache = std::move(m->create_kv_cache(o)).value();
  a.fake.tokens = {tokens};
  ASSERT_OK(a.cache->resume({}));
  for (uint64_t t = 16; t <= 48; t += 16) {  // snapshots at every block boundary
    ASSERT_OK(advance(engine, a, t));
    ASSERT_OK(commit_computed(a));
  }
  EXPECT_EQ(m->probe_reuse({}, tokens, o.multimodal).reused_tokens, 48u);
  std::vector<MultimodalItem> other = o.multimodal;
  other[0].digest[5] = 10;
  EXPECT_EQ(m->probe_reuse({}, tokens, other).reused_tokens, 16u);  // block 1 holds the item
}

TEST_F(Reuse, DuplicateBlocksAreAdoptedAndOwnPagesFreed) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 200);
  Request a = make_request(*m, tokens, 160);
  Request b = make_request(*m, tokens, 160);  // created before A commits: nothing to reuse
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(advance(engine, a, 160));
  ASSERT_OK(advance(engine, b, 160));
  ASSERT_OK(commit_computed(a));
  ASSERT_OK(b.cache->resize(160, 160));  // B's stale window blocks go now, not in the commit
  const uint64_t free_before = m->storage_stats().tiers[0].pool_groups[2].free_slots;
  ASSERT_OK(commit_computed(b));
  // B's ten full blocks and three live window blocks now use A's pages; B's own were freed.
  EXPECT_EQ(m->storage_stats().tiers[0].pool_groups[2].free_slots, free_before + 13);
  const auto ta = a.cache->block_table(kFull), tb = b.cache->block_table(kFull);
  EXPECT_TRUE(std::equal(ta->begin(), ta->end(), tb->begin(), tb->end()));
  ASSERT_OK(engine.verify(*b.cache, b.fake));
  ASSERT_OK(advance(engine, b, 200));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, OptionalGroupsAreChosenAtTheFirstResume) {
  LifecycleModel model;
  model.optional_attention = true;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const CacheGroupId optional(3);  // after full attention REQUIRED, before the window
  ASSERT_EQ(m->plan().cache_group(optional).policy, ReusePolicy::kOptional);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 64);
  ASSERT_OK(resume_compute_commit(engine, a, 64));
  ASSERT_OK(a.cache->close());

  Request b = make_request(*m, tokens, 80);
  const ReuseMatch match = b.cache->reuse_match();
  EXPECT_EQ(match.reused_tokens, 64u);
  EXPECT_EQ(match.groups[optional.value].endpoint, 64u);
  EXPECT_TRUE(match.groups[optional.value].complete);
  // An invalid choice is an error and the cache stays SUSPENDED with nothing changed.
  const std::string before = testing::debug_snapshot(*m);
  const Status bad = b.cache->resume({}, {kFull});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("only OPTIONAL groups can be selected"), std::string::npos);
  EXPECT_EQ(b.cache->state(), CacheState::kSuspended);
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  // can_resume judges either choice (the one the record has and the other) and changes nothing.
  EXPECT_OK(b.cache->can_resume({optional}));
  EXPECT_OK(b.cache->can_resume({}));
  EXPECT_OK(b.cache->can_resume({optional}));
  EXPECT_EQ(b.cache->can_resume({kFull}).message(), bad.message());
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  // Selected: the OPTIONAL group uses the matched pages.
  ASSERT_OK(b.cache->resume({}, {optional}));
  ASSERT_OK(engine.verify(*b.cache, b.fake));
  EXPECT_EQ(m->reuse_stats().groups[optional.value].hits, 1u);
  ASSERT_OK(b.cache->suspend());
  ASSERT_OK(b.cache->resume({}));  // the choice persists
  ASSERT_OK(engine.verify(*b.cache, b.fake));

  // Not selected: fresh pages, which the engine recomputes; no lookup counted for the group.
  Request c = make_request(*m, tokens, 80);
  ASSERT_OK(c.cache->resume({}));
  EXPECT_NE((*c.cache->block_table(optional))[0], (*b.cache->block_table(optional))[0]);
  EXPECT_EQ((*c.cache->block_table(kFull))[0], (*b.cache->block_table(kFull))[0]);
  ASSERT_OK(engine.recompute_group(*c.cache, c.fake, optional));
  ASSERT_OK(engine.verify(*c.cache, c.fake));
  EXPECT_EQ(m->reuse_stats().groups[optional.value].lookups, 1u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, TreePagesEvictedToHostComeBackOnAHit) {
  LifecycleModel model;
  model.record_events = true;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 200);
  Request a = make_request(*m, tokens, 160);
  ASSERT_OK(resume_compute_commit(engine, a, 160));
  ASSERT_OK(a.cache->close());
  // Pressure: the tree's DROPPABLE pages move to the host.
  Request big = make_request(*m, random_tokens(rng_, 5000), 10);
  ASSERT_OK(big.cache->resume({}));
  ASSERT_OK(big.cache->resize(16 * 230, 16 * 230 - 1));
  ASSERT_OK(big.cache->close());
  EXPECT_GT(m->take_iteration_stats().pages_offloaded, 0u);
  size_t moved_to_host = 0;
  for (const CacheEvent& e : m->take_events()) {
    moved_to_host += e.kind == CacheEventKind::kUpdated && e.tier == TierKind::kHost ? 1 : 0;
  }
  EXPECT_GT(moved_to_host, 0u);
  Request b = make_request(*m, tokens, 200);
  EXPECT_EQ(b.cache->reuse_match().reused_tokens, 160u);
  EXPECT_GT(m->reuse_stats().pages_served_by_tier[static_cast<size_t>(TierKind::kHost)], 0u);
  ASSERT_OK(b.cache->resume({}));
  EXPECT_GT(m->take_iteration_stats().pages_onboarded, 0u);
  ASSERT_OK(engine.verify(*b.cache, b.fake));
}

TEST_F(Reuse, DroppedPagesLeaveTheTreeAndEventsSayWhat) {
  LifecycleModel model;
  model.record_events = true;
  model.host_quota = 0;  // the GPU is the last tier: evicted tree pages are dropped
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 200);
  Request a = make_request(*m, tokens, 160);
  ASSERT_OK(resume_compute_commit(engine, a, 160));
  ASSERT_OK(a.cache->close());
  std::vector<CacheEvent> events = m->take_events();
  size_t stored = 0;
  for (const CacheEvent& e : events) stored += e.kind == CacheEventKind::kStored ? 1 : 0;
  EXPECT_EQ(stored, 10u + 3u + 1u);  // full blocks, the window's live blocks, the snapshot
  EXPECT_EQ(events[0].tokens.size(), 16u);
  EXPECT_EQ(events[0].tier, TierKind::kGpu);
  EXPECT_EQ(events[0].priority, 35);
  EXPECT_EQ(events[1].parent_key, events[0].key);  // block 1 hangs under block 0
  Request big = make_request(*m, random_tokens(rng_, 5000), 10);
  ASSERT_OK(big.cache->resume({}));
  ASSERT_OK(big.cache->resize(16 * 118, 0));
  EXPECT_GT(m->take_iteration_stats().pages_dropped, 0u);
  events = m->take_events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, CacheEventKind::kRemoved);
  EXPECT_LT(m->probe_reuse({}, tokens).reused_tokens, 160u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, ClearReusableBlocksEmptiesTheTree) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 64);
  ASSERT_OK(resume_compute_commit(engine, a, 64));
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 64u);
  m->clear_reusable_blocks();
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 0u);
  ASSERT_OK(engine.verify(*a.cache, a.fake));  // A keeps its pages
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, ProbesRunFromSeveralThreadsWithoutSideEffects) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 300);
  Request a = make_request(*m, tokens, 256);
  ASSERT_OK(resume_compute_commit(engine, a, 256));
  const std::string before = testing::debug_snapshot(*m);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (m->probe_reuse({}, tokens).reused_tokens != 256) ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(testing::debug_snapshot(*m), before);
}

TEST_F(Reuse, NoBlockReuseMeansNoTree) {
  LifecycleModel model;
  model.block_reuse = false;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 64);
  ASSERT_OK(resume_compute_commit(engine, a, 64));
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 0u);
  EXPECT_EQ(m->reuse_stats().tree_blocks, 0u);
}

}  // namespace
}  // namespace hybridkv
