// Calls serving engines make (issue 11, items 13-15): prefetch ahead of resume, per-group and
// per-step statistics with get-and-reset, reuse coverage as token ranges, runtime quotas.
#include <gtest/gtest.h>

#include <string>

#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::advance;
using testing::LifecycleModel;
using testing::make_manager;
using testing::make_request;
using testing::random_tokens;
using testing::Request;

constexpr PoolGroupId kAttentionPool(2);  // full and window groups share it
constexpr CacheGroupId kSsm(0), kPrivate(1), kFull(2), kWindow(3);

size_t pages_on_host(const KvCacheManager& m) {
  const std::string snap = testing::debug_snapshot(m);
  size_t n = 0;
  for (size_t at = snap.find(" HOST:"); at != std::string::npos; at = snap.find(" HOST:", at + 1))
    ++n;
  return n;
}

class EngineCalls : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{77};
};

// A computes 160 tokens and is suspended; B takes every free attention slot and twelve more:
// twelve of A's pages go to the host.
void suspend_a_with_twelve_pages_away(KvCacheManager& m, testing::FakeEngine& engine, Request& a,
                                      Request& b, std::mt19937_64& rng) {
  a = make_request(m, random_tokens(rng, 200), 160);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 160));
  ASSERT_OK(a.cache->suspend());
  b = make_request(m, random_tokens(rng, 5000), 5000);
  ASSERT_OK(b.cache->resume({}));
  const uint64_t free_now = m.storage_stats().tiers[0].pool_groups[kAttentionPool.value].free_slots;
  ASSERT_EQ((free_now + 12) % 2, 0u);  // full and window blocks come in pairs at history 0
  ASSERT_OK(b.cache->resize((free_now + 12) / 2 * 16, 0));
  ASSERT_EQ(pages_on_host(m), 12u);
}

TEST_F(EngineCalls, PrefetchOnboardsASuspendedCacheSoResumeOnlyWaits) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a, b;
  ASSERT_NO_FATAL_FAILURE(suspend_a_with_twelve_pages_away(*m, engine, a, b, rng_));
  // While B holds the whole GPU, a prefetch finds no room: refused, nothing changes.
  const std::string before = testing::debug_snapshot(*m);
  const Status full = a.cache->prefetch();
  EXPECT_EQ(full.code(), StatusCode::kOutOfPages) << full.to_string();
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  ASSERT_OK(b.cache->close());
  (void)m->take_iteration_stats();
  // The prefetch brings the twelve back; A stays SUSPENDED (its pages HELD).
  ASSERT_OK(a.cache->prefetch());
  EXPECT_EQ(a.cache->state(), CacheState::kSuspended);
  const IterationStats prefetched = m->take_iteration_stats();
  EXPECT_EQ(prefetched.pages_onboarded, 12u);
  // Per group: the twelve are full and window pages, whole 8,192 B slots each.
  const GroupIterationStats& full_pages = prefetched.groups[kFull.value];
  const GroupIterationStats& window = prefetched.groups[kWindow.value];
  EXPECT_EQ(full_pages.onboarded_blocks + window.onboarded_blocks, 12u);
  EXPECT_EQ(full_pages.onboarded_bytes + window.onboarded_bytes, 12u * 8192);
  EXPECT_EQ(pages_on_host(*m), 0u);
  ASSERT_OK(a.cache->prefetch());  // nothing left to do
  EXPECT_EQ(m->take_iteration_stats().pages_onboarded, 0u);
  // The resume copies nothing more: it waits on the prefetch's copies, and every byte is there.
  ASSERT_OK(a.cache->resume({}));
  EXPECT_EQ(m->take_iteration_stats().pages_onboarded, 0u);
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  EXPECT_EQ(a.cache->prefetch().code(), StatusCode::kFailedPrecondition);  // ACTIVE
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// A scheduler spreads a long prefix's onboarding over the steps before its resume.
TEST_F(EngineCalls, PrefetchInPartsOnboardsAtMostTheAskedPagesEachCall) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a, b;
  ASSERT_NO_FATAL_FAILURE(suspend_a_with_twelve_pages_away(*m, engine, a, b, rng_));
  const std::string before = testing::debug_snapshot(*m);
  EXPECT_EQ(a.cache->prefetch(5).status().code(), StatusCode::kOutOfPages);  // B holds the GPU
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  ASSERT_OK(b.cache->close());
  const Result<uint64_t> none = a.cache->prefetch(0);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("max_pages"), std::string::npos);
  (void)m->take_iteration_stats();
  size_t away = 12;
  // pages_away tells a scheduler when the rest is few enough to resume in its step.
  ASSERT_TRUE(a.cache->pages_away().is_ok());
  EXPECT_EQ(*a.cache->pages_away(), away);
  for (const uint64_t expected : {5u, 5u, 2u, 0u}) {  // fewer than asked: none is left away
    const Result<uint64_t> moved = a.cache->prefetch(5);
    ASSERT_TRUE(moved.is_ok()) << moved.status().to_string();
    EXPECT_EQ(*moved, expected);
    EXPECT_EQ(m->take_iteration_stats().pages_onboarded, expected);
    away -= expected;
    EXPECT_EQ(pages_on_host(*m), away);
    EXPECT_EQ(*a.cache->pages_away(), away);
    EXPECT_EQ(a.cache->state(), CacheState::kSuspended);
    EXPECT_EQ(testing::check_invariants(*m), "");
  }
  ASSERT_OK(a.cache->resume({}));
  EXPECT_EQ(m->take_iteration_stats().pages_onboarded, 0u);
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  EXPECT_EQ(a.cache->prefetch(5).status().code(), StatusCode::kFailedPrecondition);  // ACTIVE
  const Result<uint64_t> active = a.cache->pages_away();
  EXPECT_EQ(active.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(active.status().message().find("pages_away"), std::string::npos)
      << active.status().to_string();
}

// A: 96 tokens computed from scratch and committed; B: the same prompt, matched.
TEST_F(EngineCalls, IterationStatsSplitByCacheGroupAndResetEachTake) {
  LifecycleModel model;
  model.host_quota = 0;  // making room drops tree pages (evictions) instead of demoting them
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 100);
  (void)m->take_iteration_stats();
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 96));
  IterationStats s = m->take_iteration_stats();
  // History 0, capacity 96: 6 blocks of 16 in the full and in the 48-token window group (all
  // live at history 0), one state and one PRIVATE replay row.
  EXPECT_EQ(s.groups[kFull.value].new_blocks, 6u);
  EXPECT_EQ(s.groups[kWindow.value].new_blocks, 6u);
  EXPECT_EQ(s.groups[kSsm.value].new_blocks, 1u);
  EXPECT_EQ(s.groups[kPrivate.value].new_blocks, 1u);
  EXPECT_EQ(s.pages_allocated, 14u);
  ASSERT_OK(testing::commit_computed(a));
  s = m->take_iteration_stats();
  // The commit at 96 copies the state into a snapshot: one GPU-to-GPU copy of a state slot.
  const uint64_t state_slot =
      m->plan().pool_group(m->plan().cache_group(kSsm).pool_group).slot_bytes;
  EXPECT_EQ(s.groups[kSsm.value].device_copy_blocks, 1u);
  EXPECT_EQ(s.groups[kSsm.value].device_copy_bytes, state_slot);
  EXPECT_EQ(s.groups[kSsm.value].new_blocks, 1u);  // the snapshot's page
  EXPECT_EQ(s.groups[kFull.value].device_copy_blocks, 0u);
  ASSERT_OK(a.cache->close());
  // B matches 96 tokens: 6 full blocks, the window's blocks 3..5 (tokens 49..95 are read from
  // 96 on), and the snapshot.
  Request b = make_request(*m, tokens, 100);
  s = m->take_iteration_stats();
  EXPECT_EQ(b.cache->reuse_match().reused_tokens, 96u);
  EXPECT_EQ(s.groups[kFull.value].reused_blocks, 6u);
  EXPECT_EQ(s.groups[kWindow.value].reused_blocks, 3u);
  EXPECT_EQ(s.groups[kSsm.value].reused_blocks, 1u);
  EXPECT_EQ(s.groups[kPrivate.value].reused_blocks, 0u);
  // A second take right away: every counter is back at zero.
  s = m->take_iteration_stats();
  for (const GroupIterationStats& g : s.groups) {
    EXPECT_EQ(g.reused_blocks + g.new_blocks + g.evicted_blocks + g.onboarded_blocks +
                  g.offloaded_blocks + g.device_copy_blocks,
              0u);
  }
  ASSERT_OK(b.cache->close());
  // C needs every attention slot: the tree's 9 attention pages are dropped (evicted).
  Request c = make_request(*m, random_tokens(rng_, 5000), 5000);
  ASSERT_OK(c.cache->resume({}));
  const uint64_t slots = m->storage_stats().tiers[0].pool_groups[kAttentionPool.value].total_slots;
  ASSERT_OK(c.cache->resize(slots / 2 * 16, 0));
  s = m->take_iteration_stats();
  EXPECT_EQ(s.groups[kFull.value].evicted_blocks + s.groups[kWindow.value].evicted_blocks, 9u);
  uint64_t evicted = 0;
  for (const GroupIterationStats& g : s.groups) evicted += g.evicted_blocks;
  EXPECT_EQ(evicted, s.pages_dropped);
}

TEST_F(EngineCalls, ReuseAndSnapshotStatsHaveAGetAndResetVariant) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 100);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 96));
  ASSERT_OK(testing::commit_computed(a));
  Request b = make_request(*m, tokens, 100);  // a lookup of 99 tokens that reuses 96
  ReuseStats s = m->take_reuse_stats();
  EXPECT_EQ(s.groups[kFull.value].lookups, 2u);  // A's (a miss) and B's
  EXPECT_EQ(s.groups[kFull.value].hits, 1u);
  EXPECT_EQ(s.groups[kFull.value].reused_tokens, 96u);
  EXPECT_EQ(s.groups[kSsm.value].snapshots_stored, 1u);
  EXPECT_EQ(s.groups[kSsm.value].aligned_snapshot_hits, 1u);
  const uint64_t blocks = s.tree_blocks;
  EXPECT_GT(blocks, 0u);
  s = m->take_reuse_stats();  // counters restart; the tree's size is a level and stays
  EXPECT_EQ(s.groups[kFull.value].lookups, 0u);
  EXPECT_EQ(s.groups[kSsm.value].snapshots_stored, 0u);
  EXPECT_EQ(s.tree_blocks, blocks);
  ASSERT_OK(a.cache->close());
  ASSERT_OK(b.cache->close());
  m->clear_reusable_blocks();
  EXPECT_EQ(m->take_reuse_stats().groups[kSsm.value].snapshots_removed, 1u);
  EXPECT_EQ(m->reuse_stats().groups[kSsm.value].snapshots_removed, 0u);  // reset by the take
}

TEST_F(EngineCalls, ReuseCoverageIsAListOfTokenRangesPerGroup) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 100);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 96));
  ASSERT_OK(testing::commit_computed(a));
  const ReuseMatch match = m->probe_reuse({}, tokens);
  ASSERT_EQ(match.reused_tokens, 96u);
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  // Full attention: every token; the 48-token window from 96: tokens 49..95, whole blocks from
  // 48; the snapshot at 96 stands for [0, 96); the PRIVATE group reuses nothing.
  EXPECT_EQ(match.groups[kFull.value].ranges, (Ranges{{0, 96}}));
  EXPECT_EQ(match.groups[kWindow.value].ranges, (Ranges{{48, 96}}));
  EXPECT_EQ(match.groups[kSsm.value].ranges, (Ranges{{0, 96}}));
  EXPECT_EQ(match.groups[kPrivate.value].ranges, Ranges{});
}

TEST(EngineCallsSinks, WindowCoverageKeepsItsSinkBlocksApart) {
  // Window 32 with 4 sink tokens (one sink block of 16).
  std::mt19937_64 rng(5);
  ManagerConfig c;
  c.tokens_per_block = 16;
  AttentionLayerConfig l;
  l.id = 0;
  l.window = 32;
  l.sink_tokens = 4;
  l.buffers = {{"key", 1024, {}, {}}};
  c.attention_layers = {l};
  c.tiers = {{TierKind::kGpu, 4ull << 20, ""}};
  c.enable_partial_reuse = true;
  auto m = std::move(KvCacheManager::create(c, {BackendKind::kNone})).value();
  const std::vector<int32_t> tokens = random_tokens(rng, 200);
  auto a = std::move(m->create_kv_cache({{}, tokens, 1, {}, {}, {}})).value();
  ASSERT_OK(a->resume({}));
  ASSERT_OK(a->resize(160, 0));
  ASSERT_OK(a->resize(160, 160));
  ASSERT_OK(a->commit(std::span<const int32_t>(tokens).first(160)));
  const ReuseMatch match = m->probe_reuse({}, tokens);
  ASSERT_EQ(match.reused_tokens, 160u);
  // From 160 the window reads 129..159 (blocks 8, 9: tokens 128..159) and the sink block 0.
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(match.groups[0].ranges, (Ranges{{0, 16}, {128, 160}}));
}

std::vector<int32_t> table_of(const KvCache& cache, CacheGroupId group) {
  const std::span<const int32_t> t = *cache.block_table(group);
  return {t.begin(), t.end()};
}

uint64_t attention_slots(const KvCacheManager& m) {
  return m.storage_stats().tiers[0].pool_groups[kAttentionPool.value].total_slots;
}

TEST_F(EngineCalls, RuntimeQuotaGrowsWithinTheReservedSlots) {
  LifecycleModel model;
  model.gpu_max_quota = 4ull << 20;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  EXPECT_EQ(*m->quota(TierKind::kGpu), 2ull << 20);
  EXPECT_EQ(m->quota(TierKind::kDisk).status().code(), StatusCode::kNotFound);
  const std::vector<uint64_t> at4 =
      *estimate_slots(testing::lifecycle_config(model), TierKind::kGpu, 4ull << 20);
  const uint64_t before = attention_slots(*m);
  ASSERT_OK(m->set_quota(TierKind::kGpu, 4ull << 20));
  EXPECT_EQ(*m->quota(TierKind::kGpu), 4ull << 20);
  const StorageStats grown = m->storage_stats();
  for (const PoolGroupStorage& pg : grown.tiers[0].pool_groups)
    EXPECT_EQ(pg.total_slots, at4[pg.pool_group.value]) << pg.pool_group.value;
  EXPECT_GT(attention_slots(*m), before);
  // A request larger than the old quota's attention pool computes and reads back every byte.
  Request a = make_request(*m, random_tokens(rng_, 9000), 9000);
  ASSERT_OK(a.cache->resume({}));
  const uint64_t tokens = (before / 2 + 10) * 16;  // full and window pages, at history 0
  ASSERT_OK(advance(engine, a, tokens));
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  // Beyond the reservation: refused, nothing changes.
  const Status beyond = m->set_quota(TierKind::kGpu, 8ull << 20);
  EXPECT_EQ(beyond.code(), StatusCode::kRefused) << beyond.to_string();
  EXPECT_NE(beyond.message().find("max_quota_bytes"), std::string::npos);
  EXPECT_EQ(*m->quota(TierKind::kGpu), 4ull << 20);
  // Below the GPU floors: refused.
  EXPECT_EQ(m->set_quota(TierKind::kGpu, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(EngineCalls, RuntimeQuotaShrinkEvictsDemotesAndMovesPagesKeepingEveryByte) {
  LifecycleModel model;
  model.gpu_quota = 4ull << 20;
  model.host_quota = 8ull << 20;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  // X takes the low slots; A (committed, closed: DROPPABLE), B (SUSPENDED: HELD) and C (ACTIVE:
  // LOCKED) come above it; X closes, so C's pages sit high in the pool.
  Request x = make_request(*m, random_tokens(rng_, 4000), 4000);
  ASSERT_OK(x.cache->resume({}));
  ASSERT_OK(advance(engine, x, 3000));
  Request a = make_request(*m, random_tokens(rng_, 200), 200);
  ASSERT_OK(testing::resume_compute_commit(engine, a, 160));
  ASSERT_OK(a.cache->close());
  Request b = make_request(*m, random_tokens(rng_, 200), 200);
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(advance(engine, b, 160));
  ASSERT_OK(b.cache->suspend());
  Request c = make_request(*m, random_tokens(rng_, 300), 300);
  ASSERT_OK(c.cache->resume({}));
  ASSERT_OK(advance(engine, c, 200));
  ASSERT_OK(x.cache->close());
  const std::vector<int32_t> c_table = table_of(*c.cache, kFull);
  // Down to 2 MiB: the attention pool shrinks below C's slots.
  const std::vector<uint64_t> at2 =
      *estimate_slots(testing::lifecycle_config(model), TierKind::kGpu, 2ull << 20);
  ASSERT_LT(at2[kAttentionPool.value], static_cast<uint64_t>(c_table.back()) + 1);
  ASSERT_OK(m->set_quota(TierKind::kGpu, 2ull << 20));
  const StorageStats shrunk = m->storage_stats();
  for (const PoolGroupStorage& pg : shrunk.tiers[0].pool_groups)
    EXPECT_EQ(pg.total_slots, at2[pg.pool_group.value]) << pg.pool_group.value;
  // C's pages moved into low slots; its table follows and its bytes came along.
  const std::vector<int32_t> moved = table_of(*c.cache, kFull);
  EXPECT_NE(moved, c_table);
  for (int32_t slot : moved) {
    if (slot != kBadPageIndex) {
      EXPECT_LT(static_cast<uint64_t>(slot), at2[kAttentionPool.value]);
    }
  }
  ASSERT_OK(engine.verify(*c.cache, c.fake));
  ASSERT_OK(c.cache->close());
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(engine.verify(*b.cache, b.fake));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// Only the ACTIVE caches whose pages a shrink moved get new table entries and wait for the
// moves; a cache below the new end keeps its table and its ready event.
TEST_F(EngineCalls, RuntimeQuotaShrinkMakesOnlyTheCachesWhosePagesMovedWait) {
  LifecycleModel model;
  model.gpu_quota = 4ull << 20;
  model.host_quota = 8ull << 20;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  Request low = make_request(*m, random_tokens(rng_, 200), 200);
  ASSERT_OK(low.cache->resume({}));
  ASSERT_OK(advance(engine, low, 160));
  Request x = make_request(*m, random_tokens(rng_, 4000), 4000);
  ASSERT_OK(x.cache->resume({}));
  ASSERT_OK(advance(engine, x, 3000));
  Request high = make_request(*m, random_tokens(rng_, 300), 300);
  ASSERT_OK(high.cache->resume({}));
  ASSERT_OK(advance(engine, high, 200));
  ASSERT_OK(x.cache->close());
  const std::vector<int32_t> low_table = table_of(*low.cache, kFull);
  const uint64_t low_ready = low.cache->ready_event().ticket;
  const uint64_t high_ready = high.cache->ready_event().ticket;
  ASSERT_OK(m->set_quota(TierKind::kGpu, 2ull << 20));
  EXPECT_EQ(table_of(*low.cache, kFull), low_table);
  EXPECT_EQ(low.cache->ready_event().ticket, low_ready);
  EXPECT_GT(high.cache->ready_event().ticket, high_ready);
  for (int32_t slot : table_of(*high.cache, kFull)) {
    if (slot != kBadPageIndex) {
      EXPECT_LT(static_cast<uint64_t>(slot), attention_slots(*m));
    }
  }
  ASSERT_OK(engine.verify(*low.cache, low.fake));
  ASSERT_OK(engine.verify(*high.cache, high.fake));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(EngineCalls, RuntimeQuotaShrinkIsRefusedWhenLockedPagesAloneExceedIt) {
  LifecycleModel model;
  model.gpu_quota = 4ull << 20;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<uint64_t> at2 =
      *estimate_slots(testing::lifecycle_config(model), TierKind::kGpu, 2ull << 20);
  Request a = make_request(*m, random_tokens(rng_, 9000), 9000);
  ASSERT_OK(a.cache->resume({}));
  // LOCKED attention pages: two per 16 tokens at history 0, ten more than 2 MiB has slots.
  ASSERT_OK(a.cache->resize((at2[kAttentionPool.value] / 2 + 5) * 16, 0));
  const std::string before = testing::debug_snapshot(*m);
  const Status s = m->set_quota(TierKind::kGpu, 2ull << 20);
  EXPECT_EQ(s.code(), StatusCode::kOutOfPages) << s.to_string();
  EXPECT_NE(s.message().find("LOCKED"), std::string::npos) << s.message();
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  EXPECT_EQ(*m->quota(TierKind::kGpu), 4ull << 20);
}

}  // namespace
}  // namespace hybridkv
