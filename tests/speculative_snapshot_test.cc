// Snapshots kept only while memory is not short (issue 35 item 1): speculative snapshots
// (SnapshotRole::kSpeculative: periodic points, the end of a prompt that aligned_end placed a
// point inside of) are published demoted and supersede nothing; a resume from one makes it an
// ordinary snapshot. Rebalancing counts the pages dropped above for want of a free slot as
// pressure, against slots no other pool group ever needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "bundled_models.h"
#include "cache/rebalance_policy.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/testing/inspect.h"
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
using V = std::vector<std::pair<uint64_t, bool>>;

constexpr CacheGroupId kSsm(0);

// Demoted flags of the tree's snapshots, by depth.
V demoted_snapshots(const KvCacheManager& m, std::optional<CacheGroupId> group = kSsm) {
  V out;
  for (const TreePage& t : testing::tree_pages(m)) {
    if (t.group == *group) out.push_back({t.start + t.coverage, t.demoted});
  }
  std::sort(out.begin(), out.end());
  return out;
}

class Speculative : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{35};
  std::unique_ptr<KvCacheManager> m_ = make_manager(LifecycleModel{});
  testing::FakeEngine engine_{*m_};

  // Free slots of the state pool group on a tier (0: GPU, 1: host).
  uint64_t free_states(size_t tier = 0) const {
    const PoolGroupId pg = m_->plan().cache_group(kSsm).pool_group;
    return m_->storage_stats().tiers[tier].pool_groups[pg.value].free_slots;
  }
  void snapshot(Request& r, uint64_t upto, SnapshotRole role) {
    ASSERT_OK(advance(engine_, r, upto));
    ASSERT_OK(testing::commit_computed(r, false, role));
  }
};

TEST_F(Speculative, PublishedDemotedSupersedingNothingAndOrdinaryOnceServed) {
  const std::vector<int32_t> tokens = random_tokens(rng_, 130);
  Request a = make_request(*m_, tokens, 128);
  ASSERT_OK(a.cache->resume({}));
  snapshot(a, 32, SnapshotRole::kKept);
  snapshot(a, 64, SnapshotRole::kSpeculative);
  // The kept snapshot at 32 is not superseded by the speculative one below it.
  EXPECT_EQ(demoted_snapshots(*m_), (V{{32, false}, {64, true}}));
  snapshot(a, 96, SnapshotRole::kKept);  // supersedes 32, past the speculative 64
  EXPECT_EQ(demoted_snapshots(*m_), (V{{32, true}, {64, true}, {96, false}}));
  // A prompt that leaves the path after 70 tokens resumes from the speculative snapshot: from
  // now on an ordinary one, which 96 supersedes but nothing else changes.
  std::vector<int32_t> other(tokens.begin(), tokens.begin() + 70);
  other.resize(90, 7);
  Request b = make_request(*m_, other, 90);
  EXPECT_EQ(b.cache->reuse_match().reused_tokens, 64u);
  EXPECT_EQ(demoted_snapshots(*m_), (V{{32, true}, {64, false}, {96, false}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

// A speculative snapshot that goes leaves the verdicts above it as they were: the kept snapshot
// at 32 stays superseded by the one at 64.
TEST_F(Speculative, DroppingOneLeavesTheKeptSnapshotsAboveAsTheyWere) {
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m_, tokens, 96);
  ASSERT_OK(a.cache->resume({}));
  snapshot(a, 32, SnapshotRole::kKept);
  snapshot(a, 64, SnapshotRole::kKept);
  snapshot(a, 96, SnapshotRole::kSpeculative);
  EXPECT_EQ(demoted_snapshots(*m_), (V{{32, true}, {64, false}, {96, true}}));
  Result<PlannedDrop> drop = a.cache->plan_snapshot_drop();  // the snapshot at 96
  ASSERT_TRUE(drop.is_ok()) << drop.status().to_string();
  ASSERT_OK(drop->release());
  EXPECT_EQ(demoted_snapshots(*m_), (V{{32, true}, {64, false}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

// A speculative snapshot that would cost a page of value (here a kept snapshot pushed off the
// GPU into a host tier full of kept ones, which drops one) is not taken: its commit publishes
// the KV only. Moving a kept snapshot down into room is no loss: then it is taken.
TEST_F(Speculative, TakenOnlyWhereItEvictsNothingOfValue) {
  Request first = make_request(*m_, random_tokens(rng_, 40), 32);
  ASSERT_OK(first.cache->resume({}));
  snapshot(first, 32, SnapshotRole::kSpeculative);  // the GPU has room: taken
  EXPECT_EQ(demoted_snapshots(*m_), (V{{32, true}}));
  ASSERT_OK(first.cache->close());
  m_->clear_reusable_blocks();  // the tree starts empty again
  // Kept snapshots until both tiers' state pool groups are full of them.
  for (int i = 0; i < 2000 && (free_states() > 1 || free_states(1) > 0); ++i) {
    Request r = make_request(*m_, random_tokens(rng_, 40), 32);
    ASSERT_OK(r.cache->resume({}));
    snapshot(r, 32, SnapshotRole::kKept);
    ASSERT_OK(r.cache->close());
  }
  ASSERT_LE(free_states(), 1u) << "the GPU's state pool group never filled";
  ASSERT_EQ(free_states(1), 0u) << "the host's state pool group never filled";
  const size_t snapshots = demoted_snapshots(*m_).size();
  Request s = make_request(*m_, random_tokens(rng_, 40), 32);
  ASSERT_OK(s.cache->resume({}));  // its live state takes the last free slot
  ASSERT_EQ(free_states(), 0u);
  snapshot(s, 32, SnapshotRole::kSpeculative);
  EXPECT_EQ(s.cache->committed_tokens(), 32u);  // the KV is published all the same
  EXPECT_EQ(demoted_snapshots(*m_).size(), snapshots) << "taken at the cost of a kept one";
  const ReuseMatch probe = m_->probe_reuse({}, s.fake.tokens[0]);
  EXPECT_EQ(probe.reused_tokens, 0u) << "taken at the cost of a kept one";
  EXPECT_EQ(probe.hybrid_tokens, 32u);  // its KV is there
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

// The policy: wants alone take slots only from a pool group that never needed them.
TEST(SpeculativeRebalance, WantsTakeOnlySlotsNoOtherPoolGroupEverNeeded) {
  const cache_detail::RebalancePolicy* p = cache_detail::find_rebalance_policy("pressure").value();
  std::vector<cache_detail::PoolPressure> pools(2);
  pools[0] = {PoolGroupId(0), 100, 1 << 20, 0, 0, 0, 0, 20, true, true};  // state: 20 wants
  pools[1] = {PoolGroupId(1), 1000, 1 << 20, 900, 0, 5, 0, 0, false, true};
  const uint64_t quota = 1100ull << 20;
  std::optional<std::vector<uint64_t>> want = p->target(quota, pools);
  ASSERT_TRUE(want.has_value());
  EXPECT_GT((*want)[0], 100u);
  EXPECT_LT((*want)[1], 1000u);
  EXPECT_LE((*want)[0] + (*want)[1], 1100u);
  pools[1].ever_full = true;  // the attention pool group needed its slots once: keeps them
  EXPECT_FALSE(p->target(quota, pools).has_value());
  pools[0].wants = 5;  // too few to count
  pools[1].ever_full = false;
  EXPECT_FALSE(p->target(quota, pools).has_value());
}

// need_adjustment asks pressed() before it measures the pool groups' ages: a tier that is not
// pressed must be one target() would leave as it is, whatever the ages. Random tiers; the seed
// is printed (HKV_SEED replays one).
TEST(SpeculativeRebalance, ATierThatIsNotPressedIsLeftAsItIsWhateverTheAges) {
  const cache_detail::RebalancePolicy* p = cache_detail::find_rebalance_policy("pressure").value();
  uint64_t seed = std::random_device{}();
  if (const char* e = std::getenv("HKV_SEED")) seed = std::strtoull(e, nullptr, 10);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  size_t pressed = 0;
  for (int round = 0; round < 20000; ++round) {
    std::vector<cache_detail::PoolPressure> pools(2 + rng() % 3);
    uint64_t quota = 0;
    for (size_t i = 0; i < pools.size(); ++i) {
      cache_detail::PoolPressure& q = pools[i];
      q.id = PoolGroupId(static_cast<uint32_t>(i));
      q.slots = rng() % 2000;
      q.slot_bytes = uint64_t{1} << (10 + rng() % 10);
      q.free = q.slots ? rng() % (q.slots + 1) : 0;
      q.floor = q.slots ? rng() % (q.slots + 1) / 4 : 0;
      q.victims = rng() % 32;
      q.wants = rng() % 32;
      q.ever_full = rng() % 2;
      q.traded = rng() % 4 != 0;
      quota += q.slots * q.slot_bytes;
    }
    quota += rng() % (quota / 8 + 1);
    const bool is_pressed = p->pressed(pools);
    pressed += is_pressed;
    for (int ages = 0; ages < 4; ++ages) {
      for (cache_detail::PoolPressure& q : pools)
        q.age = rng() % 8 == 0 ? UINT64_MAX : rng() % 100000;
      if (!is_pressed) {
        ASSERT_FALSE(p->target(quota, pools).has_value()) << "round " << round;
      }
    }
  }
  EXPECT_GT(pressed, 0u);
}

// Where the hybrid manager takes which kind: periodic points are speculative, aligned-end
// points kept, and the prompt's end speculative when an aligned-end point lies inside it.
TEST(SpeculativeHybrid, PeriodicAndSecondGuessEndPointsAreSpeculative) {
  ServingConfig s;
  s.max_batch = 2;
  s.tokens_per_block = 16;
  s.tiers = {{TierKind::kGpu, 1ull << 30, ""}};
  s.snapshots.periodic_interval = 512;
  s.snapshots.aligned_end = 512;
  auto h = std::move(HybridCacheManager::create(testing::bundled_model("nemotron_h_8b.json", 8), s,
                                                {BackendKind::kNone}))
               .value();
  auto prefill = [&](uint64_t id, size_t len) {
    std::vector<int32_t> prompt(len);
    for (size_t i = 0; i < len; ++i) prompt[i] = static_cast<int32_t>(id * 100000 + i);
    ASSERT_OK(h->add_request(id, prompt));
    ASSERT_OK(h->resume(id));
    for (uint64_t at = 0; at < len;) {
      const uint64_t next = *h->next_snapshot_point(id);
      ASSERT_OK(h->resize(id, next, at));
      ASSERT_OK(h->resize(id, next, next));
      ASSERT_OK(h->commit_at_snapshot(id));
      at = next;
    }
    ASSERT_OK(h->free_request(id));
  };
  const CacheGroupId state = *h->state_group();
  ASSERT_NO_FATAL_FAILURE(prefill(1, 1300));
  EXPECT_EQ(demoted_snapshots(h->manager(), state), (V{{512, true}, {1024, false}, {1300, true}}));
  // A prompt of one aligned grain and a bit: its end is the second guess too; a prompt shorter
  // than a grain has no aligned point, and its end is kept.
  ASSERT_NO_FATAL_FAILURE(prefill(2, 400));
  V got = demoted_snapshots(h->manager(), state);
  EXPECT_EQ(std::count(got.begin(), got.end(), std::pair<uint64_t, bool>{400, false}), 1);
}

}  // namespace
}  // namespace hybridkv

namespace hybridkv {
namespace {

// States inside a step: the kernel writes the state at 32 and 64 into reserved pages while the
// chunk runs to 96; commits at 32 and 64 publish them; a prompt that leaves the path after 70
// tokens resumes from the state at 64, and its bytes are those of 64 tokens. (A window of 128
// tokens: with 48, the window KV a match at 64 needs left the window inside the chunk.)
TEST_F(Speculative, ReservedStatesBecomeSnapshotsInsideOneChunk) {
  LifecycleModel model;
  model.window = 128;
  m_ = make_manager(model);
  testing::FakeEngine engine(*m_);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m_, tokens, 96);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(a.cache->resize(96, 0));
  const std::vector<uint64_t> want{32, 64};
  Result<std::vector<uint64_t>> got = a.cache->reserve_states(want);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, want);
  const std::vector<int32_t> slots = *a.cache->reserved_state_slots(kSsm);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(testing::check_invariants(*m_), "");
  engine.write_states_at(*a.cache, a.fake, kSsm, want, slots);
  ASSERT_OK(advance(engine, a, 96));
  ASSERT_OK(a.cache->resize(96, 96));
  std::span<const int32_t> all(a.fake.tokens[0]);
  ASSERT_OK(a.cache->commit(all.subspan(0, 32), false, SnapshotRole::kSpeculative));
  ASSERT_OK(a.cache->commit(all.subspan(32, 32), false, SnapshotRole::kSpeculative));
  ASSERT_OK(a.cache->commit(all.subspan(64, 32)));
  EXPECT_EQ(demoted_snapshots(*m_), (V{{32, true}, {64, true}, {96, false}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
  std::vector<int32_t> other(tokens.begin(), tokens.begin() + 70);
  other.resize(90, 7);
  Request b = make_request(*m_, other, 90);
  EXPECT_EQ(b.cache->reuse_match().reused_tokens, 64u);
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(engine.verify(*b.cache, b.fake));
  ASSERT_OK(a.cache->close());
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

}  // namespace
}  // namespace hybridkv
