// Snapshot-aware eviction (issue 12 item 4): KV that no snapshot can resume into, and snapshots a
// deeper one supersedes, are demoted: evicted first and dropped rather than copied down a tier.
#include <gtest/gtest.h>

#include <algorithm>

#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::advance;
using testing::LifecycleModel;
using testing::make_manager;
using testing::make_request;
using testing::random_tokens;
using testing::Request;
using testing::TreePage;

constexpr CacheGroupId kSsm(0), kFull(2);

// Demoted flags of the tree's pages of `group`, by block start.
std::vector<std::pair<uint64_t, bool>> demoted(const KvCacheManager& m, CacheGroupId group) {
  std::vector<std::pair<uint64_t, bool>> out;
  for (const TreePage& t : testing::tree_pages(m)) {
    if (t.group == group) out.push_back({t.start + t.coverage, t.demoted});
  }
  std::sort(out.begin(), out.end());
  return out;
}

class EvictionOrder : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{7};
  std::unique_ptr<KvCacheManager> m_ = make_manager(LifecycleModel{});
  testing::FakeEngine engine_{*m_};

  // Computes `upto` tokens of `r` and publishes their KV only (no snapshot).
  void compute_kv(Request& r, uint64_t upto) {
    ASSERT_OK(advance(engine_, r, upto));
    ASSERT_OK(r.cache->resize(upto, upto));
    const uint64_t from = r.cache->committed_tokens();
    std::span<const int32_t> all(r.fake.tokens[0]);
    ASSERT_OK(r.cache->commit_kv(all.subspan(from, upto - from)));
  }
  // The same with the SSM snapshot at `upto`.
  void compute_snapshot(Request& r, uint64_t upto) {
    ASSERT_OK(advance(engine_, r, upto));
    ASSERT_OK(testing::commit_computed(r));
  }
};

TEST_F(EvictionOrder, KvPastTheDeepestSnapshotIsDemotedUntilASnapshotCoversIt) {
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m_, tokens, 96);
  ASSERT_OK(a.cache->resume({}));
  compute_kv(a, 64);
  using V = std::vector<std::pair<uint64_t, bool>>;
  EXPECT_EQ(demoted(*m_, kFull), (V{{16, true}, {32, true}, {48, true}, {64, true}}));
  compute_snapshot(a, 96);  // a snapshot at 96 makes every block under it worth keeping
  EXPECT_EQ(demoted(*m_, kFull),
            (V{{16, false}, {32, false}, {48, false}, {64, false}, {80, false}, {96, false}}));
  EXPECT_EQ(demoted(*m_, kSsm), (V{{96, false}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

TEST_F(EvictionOrder, SupersededSnapshotIsDemotedAndPromotedByAHitOrWhenTheDeeperOneGoes) {
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m_, tokens, 96);
  ASSERT_OK(a.cache->resume({}));
  compute_snapshot(a, 32);
  compute_snapshot(a, 64);
  using V = std::vector<std::pair<uint64_t, bool>>;
  EXPECT_EQ(demoted(*m_, kSsm), (V{{32, true}, {64, false}}));  // no fork between 32 and 64
  // A prompt that leaves the path after 40 tokens resumes from the snapshot at 32: promoted.
  std::vector<int32_t> other(tokens.begin(), tokens.begin() + 40);
  other.resize(60, 7);
  Request b = make_request(*m_, other, 60);
  EXPECT_EQ(b.cache->reuse_match().reused_tokens, 32u);
  EXPECT_EQ(demoted(*m_, kSsm), (V{{32, false}, {64, false}}));
  Result<PlannedDrop> drop = a.cache->plan_snapshot_drop();
  ASSERT_TRUE(drop.is_ok()) << drop.status().to_string();
  ASSERT_OK(drop->release());  // the snapshot at 64 goes
  EXPECT_EQ(demoted(*m_, kSsm), (V{{32, false}}));
  // The KV between 32 and 64 lost its last snapshot: demoted; the KV under 32 is not.
  EXPECT_EQ(demoted(*m_, kFull), (V{{16, false}, {32, false}, {48, true}, {64, true}}));
  compute_snapshot(a, 80);  // supersedes 32 again (no fork between them)
  EXPECT_EQ(demoted(*m_, kSsm), (V{{32, true}, {80, false}}));
  EXPECT_EQ(demoted(*m_, kFull),
            (V{{16, false}, {32, false}, {48, false}, {64, false}, {80, false}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

TEST_F(EvictionOrder, DemotedPagesAreDroppedFirstAndNeverCopiedDown) {
  const std::vector<int32_t> tokens = random_tokens(rng_, 400);
  Request a = make_request(*m_, tokens, 320);
  ASSERT_OK(a.cache->resume({}));
  compute_snapshot(a, 160);
  compute_kv(a, 320);  // blocks 160..320: no snapshot under them
  ASSERT_OK(a.cache->close());
  // Another request grows until the GPU is full and the tree's pages must leave it.
  Request big = make_request(*m_, random_tokens(rng_, 20000), 20000);
  ASSERT_OK(big.cache->resume({}));
  for (uint64_t upto = 64; upto <= 20000 && advance(engine_, big, upto).is_ok(); upto += 64) {
  }
  bool kept_on_host = false;
  for (const TreePage& t : testing::tree_pages(*m_)) {
    if (t.group != kFull) continue;
    EXPECT_FALSE(t.start >= 160 && t.tier != TierKind::kGpu)
        << "demoted block at " << t.start << " was copied down";
    kept_on_host |= t.start < 160 && t.tier == TierKind::kHost;
  }
  EXPECT_TRUE(kept_on_host) << "the GPU never filled: the test proves nothing";
  EXPECT_EQ(m_->probe_reuse({}, tokens).reused_tokens, 160u);
  EXPECT_EQ(testing::check_invariants(*m_), "");
}
// Snapshot pricing: a snapshot ages 1 / worth times as fast as a neutral page, worth = depth /
// (depth + the KV tokens its bytes would hold) times 1 + the resumes it served (at most 2).
TEST_F(EvictionOrder, AShortPromptsSnapshotAgesFasterAndEachResumeSlowsIt) {
  std::vector<int32_t> long_tokens = random_tokens(rng_, 200);
  Request a = make_request(*m_, long_tokens, 200);
  ASSERT_OK(a.cache->resume({}));
  compute_snapshot(a, 160);
  const std::vector<int32_t> short_tokens = random_tokens(rng_, 40);
  Request b = make_request(*m_, short_tokens, 40);
  ASSERT_OK(b.cache->resume({}));
  compute_snapshot(b, 16);
  auto age_class_at = [&](uint64_t end) {
    for (const TreePage& t : testing::tree_pages(*m_)) {
      if (t.group == kSsm && t.start + t.coverage == end) return int{t.age_class};
    }
    return -1;
  };
  const int short_class = age_class_at(16);
  const int long_class = age_class_at(160);
  EXPECT_GT(short_class, long_class);
  EXPECT_GT(long_class, 4);  // still faster than KV: its own bytes are not free
  ASSERT_OK(b.cache->close());
  Request c = make_request(*m_, short_tokens, 40);  // resumes from b's snapshot
  ASSERT_EQ(c.cache->reuse_match().reused_tokens, 16u);
  EXPECT_LT(age_class_at(16), short_class);
  EXPECT_EQ(testing::check_invariants(*m_), "");

  LifecycleModel unpriced;
  unpriced.snapshot_pricing = false;
  auto m = make_manager(unpriced);
  testing::FakeEngine engine(*m);
  Request d = make_request(*m, short_tokens, 40);
  ASSERT_OK(d.cache->resume({}));
  ASSERT_OK(advance(engine, d, 16));
  ASSERT_OK(testing::commit_computed(d));
  for (const TreePage& t : testing::tree_pages(*m)) EXPECT_EQ(t.age_class, 4) << t.start;
}

// The age class of the snapshot at `end` and of every KV page that ends at or above it (-1:
// none).
struct PathClasses {
  int snapshot = -1;
  std::vector<int> kv;
};
PathClasses path_classes(const KvCacheManager& m, uint64_t end) {
  PathClasses out;
  for (const TreePage& t : testing::tree_pages(m)) {
    if (t.group == kSsm && t.start + t.coverage == end) out.snapshot = t.age_class;
    if (t.group == kFull && t.start + t.coverage <= end) out.kv.push_back(t.age_class);
  }
  return out;
}

// A snapshot and the KV run above it serve a resume only together: the run ages with the
// snapshot, and moves with it when a resume slows the snapshot's aging.
TEST_F(EvictionOrder, TheKvRunAboveASnapshotAgesWithIt) {
  const std::vector<int32_t> tokens = random_tokens(rng_, 200);
  Request a = make_request(*m_, tokens, 200);
  ASSERT_OK(a.cache->resume({}));
  compute_snapshot(a, 160);
  const PathClasses before = path_classes(*m_, 160);
  ASSERT_EQ(before.kv.size(), 10u);  // 160 tokens, 16 per block
  EXPECT_GT(before.snapshot, 4);
  for (int c : before.kv) EXPECT_EQ(c, before.snapshot);
  ASSERT_OK(a.cache->close());
  Request b = make_request(*m_, tokens, 200);  // resumes from the snapshot at 160
  ASSERT_EQ(b.cache->reuse_match().reused_tokens, 160u);
  const PathClasses after = path_classes(*m_, 160);
  EXPECT_LT(after.snapshot, before.snapshot);
  for (int c : after.kv) EXPECT_EQ(c, after.snapshot);
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

// A conversation that went on goes on more often than a new one: a snapshot published below
// one that served this request's resume starts with the depth share that snapshot covers as
// credit; one below a snapshot nobody resumed from does not.
TEST_F(EvictionOrder, ASnapshotBelowOneThatServedAResumeStartsWithCredit) {
  const std::vector<int32_t> first = random_tokens(rng_, 170);
  Request a = make_request(*m_, first, 170);
  ASSERT_OK(a.cache->resume({}));
  compute_snapshot(a, 160);
  ASSERT_OK(a.cache->close());
  std::vector<int32_t> next(first.begin(), first.begin() + 160);  // the next turn
  const std::vector<int32_t> more = random_tokens(rng_, 90);
  next.insert(next.end(), more.begin(), more.end());
  Request b = make_request(*m_, next, 250);
  ASSERT_EQ(b.cache->reuse_match().reused_tokens, 160u);
  ASSERT_OK(b.cache->resume({}));
  compute_snapshot(b, 240);
  // A little deeper (worth a little more) with no served snapshot above: a new prompt whose
  // own earlier snapshot (at 80) was never resumed from.
  Request c = make_request(*m_, random_tokens(rng_, 270), 270);
  ASSERT_OK(c.cache->resume({}));
  compute_snapshot(c, 80);
  compute_snapshot(c, 256);
  const int credited = path_classes(*m_, 240).snapshot;
  const int uncredited = path_classes(*m_, 256).snapshot;
  ASSERT_GE(credited, 0);
  ASSERT_GE(uncredited, 0);
  // Worth about d / (d + s) for both; times 1 + 160 / 240 for the credited one: a wait 1.67
  // times as long is about 3 classes (4 per doubling).
  EXPECT_LE(credited, uncredited - 2) << credited << " vs " << uncredited;
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

// Under pressure on the state pool group, the short prompt's snapshot leaves the GPU before an
// older one of a long prompt; without pricing the older one goes first.
TEST(SnapshotPricing, TheCheaperSnapshotLeavesTheGpuFirst) {
  for (const bool priced : {true, false}) {
    SCOPED_TRACE(priced ? "priced" : "unpriced");
    std::mt19937_64 rng(13);
    LifecycleModel model;
    model.snapshot_pricing = priced;
    auto m = make_manager(model);
    testing::FakeEngine engine(*m);
    auto snapshot_at = [&](const std::vector<int32_t>& tokens, uint64_t upto) {
      Request r = make_request(*m, tokens, tokens.size());
      ASSERT_OK(r.cache->resume({}));
      ASSERT_OK(advance(engine, r, upto));
      ASSERT_OK(testing::commit_computed(r));
      ASSERT_OK(r.cache->close());
    };
    snapshot_at(random_tokens(rng, 200), 160);  // older, long
    snapshot_at(random_tokens(rng, 40), 16);    // newer, short
    std::optional<BlockKey> long_key, short_key;
    for (const TreePage& t : testing::tree_pages(*m)) {
      if (t.group != kSsm) continue;
      (t.start + t.coverage == 160 ? long_key : short_key) = t.key;
    }
    ASSERT_TRUE(long_key && short_key);
    auto on_gpu = [&](const BlockKey& key) {
      for (const TreePage& t : testing::tree_pages(*m)) {
        if (t.group == kSsm && t.key == key) return t.tier == TierKind::kGpu;
      }
      return false;
    };
    // Fresh short snapshots until one of the two leaves the GPU.
    int i = 0;
    for (; i < 2000 && on_gpu(*long_key) && on_gpu(*short_key); ++i) {
      snapshot_at(random_tokens(rng, 20), 16);
    }
    ASSERT_LT(i, 2000) << "the state pool group never came under pressure";
    EXPECT_EQ(on_gpu(*long_key), priced);
    EXPECT_EQ(on_gpu(*short_key), !priced);
    EXPECT_EQ(testing::check_invariants(*m), "");
  }
}

// One budget (issue 12 item 3): snapshots evicted while KV pages wait longer move slots to the
// state pool group; bytes stay within the quota; no GPU pool group
// goes below its floor; with rebalancing off adjust() is refused.
TEST(Rebalance, SnapshotPressureMovesSlotsToTheStatePoolGroup) {
  std::mt19937_64 rng(11);
  LifecycleModel model;
  model.pool_rebalance = true;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const PoolGroupId state = m->plan().cache_group(kSsm).pool_group;
  const PoolGroupId kv = m->plan().cache_group(kFull).pool_group;
  const uint64_t state_before =
      m->plan().slots(TierKind::kGpu, state) + m->plan().slots(TierKind::kHost, state);
  EXPECT_FALSE(m->need_adjustment());  // nothing evicted yet
  std::vector<int32_t> last;
  for (int i = 0; i < 2000 && !m->need_adjustment(); ++i) {
    last = random_tokens(rng, 20);
    Request r = make_request(*m, last, 20);
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(advance(engine, r, 16));
    ASSERT_OK(testing::commit_computed(r));
    ASSERT_OK(r.cache->close());
  }
  ASSERT_TRUE(m->need_adjustment()) << "the state pool group never came under pressure";
  Result<bool> moved = m->adjust();
  ASSERT_TRUE(moved.is_ok() && *moved) << moved.status().to_string();
  const StorageStats after = m->storage_stats();
  for (size_t t = 0; t < after.tiers.size(); ++t) {
    uint64_t bytes = 0;
    for (const PoolGroupStorage& pg : after.tiers[t].pool_groups)
      bytes += pg.total_slots * m->plan().pool_group(pg.pool_group).slot_bytes;
    EXPECT_LE(bytes, *m->quota(after.tiers[t].tier));
  }
  EXPECT_GT(after.tiers[0].pool_groups[state.value].total_slots +
                after.tiers[1].pool_groups[state.value].total_slots,
            state_before);
  EXPECT_GE(after.tiers[0].pool_groups[kv.value].total_slots, m->plan().pool_group(kv).floor_slots);
  EXPECT_EQ(m->probe_reuse({}, last).reused_tokens, 16u);  // the newest snapshot survived
  EXPECT_EQ(testing::check_invariants(*m), "");

  auto fixed = make_manager(LifecycleModel{});
  EXPECT_FALSE(fixed->need_adjustment());
  EXPECT_EQ(fixed->adjust().status().code(), StatusCode::kFailedPrecondition);
}

// Free slots are worth nothing: a pool group that can give a step from its free slots gives it
// whatever its oldest page waited. Here every request hits a shared prefix and publishes a
// block and a snapshot of its own; a dropped snapshot demotes the block above it, so the KV pool
// group's oldest page that counts is about as old as the snapshots' victims (unpriced, so both
// age alike). Before, that donor counted as young while most of its slots were free: the 1.5 x
// hysteresis stopped every step (0 in this run) and the states kept their planned 2 slots.
TEST(Rebalance, APoolGroupGivesFromItsFreeSlotsWhateverItsOldestPageWaited) {
  std::mt19937_64 rng(14);
  LifecycleModel model;
  model.pool_rebalance = true;
  model.host_quota = 0;  // one tier
  model.snapshot_pricing = false;
  const StoragePlan probe = make_manager(model)->plan();
  const PoolGroupId state = probe.cache_group(kSsm).pool_group;
  const PoolGroupId kv = probe.cache_group(kFull).pool_group;
  std::vector<double> ratio(probe.pool_groups().size(), 1.0);
  ratio[state.value] = 0.05;  // the KV pool groups get twenty times the states' bytes
  model.pool_ratio = ratio;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const auto gpu = [&](PoolGroupId pg) {
    return m->storage_stats().tiers[0].pool_groups[pg.value];
  };
  const uint64_t states_before = gpu(state).total_slots;
  const std::vector<int32_t> prefix = random_tokens(rng, 48);
  uint64_t steps = 0;
  for (int i = 0; i < 600; ++i) {
    std::vector<int32_t> tokens = prefix;
    for (int32_t t : random_tokens(rng, 20)) tokens.push_back(t);
    Request r = make_request(*m, tokens, tokens.size());
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(advance(engine, r, 64));
    ASSERT_OK(testing::commit_computed(r));
    ASSERT_OK(r.cache->close());
    if (!m->need_adjustment()) continue;
    Result<bool> moved = m->adjust();
    ASSERT_OK(moved.status());
    steps += *moved;
  }
  std::printf("states %llu -> %llu slots in %llu steps; KV free slots at the end %llu\n",
              (unsigned long long)states_before, (unsigned long long)gpu(state).total_slots,
              (unsigned long long)steps, (unsigned long long)gpu(kv).free_slots);
  EXPECT_GE(steps, 4u);
  EXPECT_GE(gpu(state).total_slots, states_before + 4);  // a step here is one slot
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// Host-tier rebalancing with bf16 snapshots, the live states' pool group planned at
// `live_share` of the others' bytes and the KV pool groups at a tenth (they come under pressure
// long before the snapshots): the host KV bytes once the snapshots' pool group is full, and at
// the end of 6,000 requests that each publish 4 blocks and a snapshot.
struct KvGrowth {
  uint64_t planned = 0;
  uint64_t when_snapshots_full = 0;
  uint64_t at_end = 0;
};
KvGrowth host_kv_growth(double live_share) {
  std::mt19937_64 rng(12);
  LifecycleModel model;
  model.pool_rebalance = true;
  model.snapshot_dtype = DType::kBF16;
  model.host_quota = 64ull << 20;  // a step (1/128 of it) is more than the live states' slots
  const StoragePlan probe = make_manager(model)->plan();
  const PoolGroupId live = probe.cache_group(kSsm).pool_group;
  const PoolGroupId snap = probe.cache_group(kSsm).page_pool_group(true);
  const PoolGroupId kv = probe.cache_group(kFull).pool_group;
  EXPECT_NE(live, snap);
  std::vector<double> ratio(probe.pool_groups().size(), 1.0);
  ratio[live.value] = live_share;
  ratio[kv.value] = 0.1;
  model.pool_ratio = ratio;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const auto host = [&](PoolGroupId pg) {
    return m->storage_stats().tiers[1].pool_groups[pg.value];
  };
  const auto kv_bytes = [&] { return host(kv).total_slots * m->plan().pool_group(kv).slot_bytes; };
  const uint64_t planned = kv_bytes();
  EXPECT_LT(host(live).total_slots * m->plan().pool_group(live).slot_bytes, (64ull << 20) / 128);
  if (live_share < 1e-3) {
    EXPECT_EQ(host(live).total_slots, 0u);
  }
  std::optional<uint64_t> when_full;
  for (int i = 0; i < 6000; ++i) {
    Request r = make_request(*m, random_tokens(rng, 68), 68);
    EXPECT_OK(r.cache->resume({}));
    EXPECT_OK(advance(engine, r, 64));
    EXPECT_OK(testing::commit_computed(r));
    EXPECT_OK(r.cache->close());
    if (m->need_adjustment()) EXPECT_OK(m->adjust().status());
    if (!when_full && host(snap).free_slots == 0) when_full = kv_bytes();
  }
  EXPECT_TRUE(when_full.has_value()) << "the snapshots never filled their pool group";
  EXPECT_EQ(testing::check_invariants(*m), "");
  std::printf(
      "live share %g: host KV bytes %llu planned, %llu when the snapshots filled theirs, %llu at "
      "the end\n",
      live_share, (unsigned long long)planned, (unsigned long long)when_full.value_or(0),
      (unsigned long long)kv_bytes());
  return {planned, when_full.value_or(0), kv_bytes()};
}

// The donor is chosen among the pool groups that can give a step's bytes: an idle pool group
// too small to give one (here the live states' on the host tier, one slot) must not stop the
// snapshot pool group from giving to the KV pool group under pressure. Before, the idle pool
// group counted as the oldest and blocked every step on its tier: the KV pool group kept its
// planned bytes (spare bytes alone give a slot or two).
TEST(Rebalance, AnIdlePoolGroupThatCannotGiveDoesNotBlockTheOthers) {
  const KvGrowth g = host_kv_growth(0.01);
  EXPECT_GE(g.at_end, g.planned + 8 * ((64ull << 20) / 128));  // eight steps or more
}

// The receiver is chosen among the pool groups under pressure: a pool group with no slot at all
// (the live states' on the host tier once it has given everything) must not count as the
// youngest and stop the others. Before, its wait read 0 and every step on its tier stopped.
TEST(Rebalance, APoolGroupWithNoSlotDoesNotBlockTheOthers) {
  const KvGrowth g = host_kv_growth(1e-6);  // rounds to no slot on the host tier
  EXPECT_GE(g.at_end, g.planned + 8 * ((64ull << 20) / 128));
}

}  // namespace
}  // namespace hybridkv
