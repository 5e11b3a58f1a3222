// An ACTIVE cache's commit path counts as resumable (PrefixIndex::hold_resumable): evicting a
// prefilling request's newest speculative snapshot no longer demotes its whole path for the
// next commit to promote again (issue 35 item 4: thousands of such flips in the slowest
// steps). Verdicts stay as they were wherever they are read: once the cache suspends or
// closes, and for a tree page beside the cache's own (a block the cache computed while the
// tree's copy sat off the GPU).
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
using V = std::vector<std::tuple<uint64_t, TierKind, bool>>;

// (start, tier, demoted) of the tree's attention pages, by start.
V kv_pages(const KvCacheManager& m) {
  V out;
  for (const TreePage& t : testing::tree_pages(m)) {
    if (m.plan().cache_group(t.group).kind == GroupKind::kAttention)
      out.push_back({t.start, t.tier, t.demoted});
  }
  std::sort(out.begin(), out.end());
  return out;
}

LifecycleModel no_window() {
  LifecycleModel model;
  model.window = 0;  // every attention block stays in its cache's rows
  return model;
}

// Drops the snapshot at the end of the cache's last commit.
void drop_snapshot(Request& r) {
  Result<PlannedDrop> drop = r.cache->plan_snapshot_drop();
  ASSERT_TRUE(drop.is_ok()) << drop.status().to_string();
  ASSERT_OK(drop->release());
}

constexpr TierKind kGpu = TierKind::kGpu;
constexpr TierKind kHost = TierKind::kHost;

class PathHold : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{351};
  std::unique_ptr<KvCacheManager> m_ = make_manager(no_window());
  testing::FakeEngine engine_{*m_};

  // A request that computed and committed two blocks, whose speculative snapshot at their end
  // is gone again: no request can resume on its path.
  Request prefilled_without_snapshot() {
    Request a = make_request(*m_, random_tokens(rng_, 40), 40);
    EXPECT_OK(a.cache->resume({}));
    EXPECT_OK(advance(engine_, a, 32));
    EXPECT_OK(testing::commit_computed(a, false, SnapshotRole::kSpeculative));
    EXPECT_EQ(kv_pages(*m_), (V{{0, kGpu, false}, {16, kGpu, false}}));
    drop_snapshot(a);
    return a;
  }
};

TEST_F(PathHold, AnActivePathStaysPromotedWhenItsSnapshotGoes) {
  Request a = prefilled_without_snapshot();
  // The request computing the path holds every page of it.
  EXPECT_EQ(kv_pages(*m_), (V{{0, kGpu, false}, {16, kGpu, false}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
  // Suspended, its pages are queued HELD: judged as before, demoted.
  ASSERT_OK(a.cache->suspend());
  EXPECT_EQ(kv_pages(*m_), (V{{0, kGpu, true}, {16, kGpu, true}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
  ASSERT_OK(a.cache->resume({}));
  EXPECT_EQ(kv_pages(*m_), (V{{0, kGpu, false}, {16, kGpu, false}}));
  // Its next snapshot makes the path resumable in its own right; closed, the cache lets go.
  ASSERT_OK(advance(engine_, a, 40));
  ASSERT_OK(engine_.verify(*a.cache, a.fake));
  ASSERT_OK(testing::commit_computed(a, true));
  a.cache.reset();
  EXPECT_EQ(kv_pages(*m_), (V{{0, kGpu, false}, {16, kGpu, false}, {32, kGpu, false}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

TEST_F(PathHold, ClosingACacheWhosePathHasNoSnapshotDemotesIt) {
  Request a = prefilled_without_snapshot();
  a.cache.reset();
  EXPECT_EQ(kv_pages(*m_), (V{{0, kGpu, true}, {16, kGpu, true}}));
  EXPECT_EQ(testing::check_invariants(*m_), "");
}

// A computes blocks whose tree pages an earlier request left on the host: it keeps its own
// (OfferResult::kKept), so the tree's pages on its path are not its to hold, and they are
// demoted as soon as no snapshot below them is left, while A is still ACTIVE.
TEST_F(PathHold, TreePagesBesideTheCachesOwnKeepTheirVerdict) {
  KvCacheManager* m = m_.get();
  testing::FakeEngine& engine = engine_;
  const std::vector<int32_t> prompt = random_tokens(rng_, 40);
  Request a = make_request(*m, prompt, 40);  // matched against an empty tree
  Request x = make_request(*m, prompt, 40);
  ASSERT_OK(testing::resume_compute_commit(engine, x, 32));  // KV and a snapshot at 32
  x.cache.reset();
  std::vector<uint64_t> all;
  const StorageStats stats = m->storage_stats();
  for (const PoolGroupStorage& pg : stats.tiers[0].pool_groups) all.push_back(pg.total_slots);
  ASSERT_OK(m->evict_ahead(all, 1000).status());
  ASSERT_EQ(kv_pages(*m), (V{{0, kHost, false}, {16, kHost, false}}));
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 32));
  std::span<const int32_t> tokens(a.fake.tokens[0]);
  ASSERT_OK(a.cache->resize(a.cache->capacity(), 32));
  ASSERT_OK(a.cache->commit_kv(tokens.subspan(0, 32)));
  drop_snapshot(a);  // the snapshot at 32, x's
  EXPECT_EQ(kv_pages(*m), (V{{0, kHost, true}, {16, kHost, true}}));
  EXPECT_EQ(testing::check_invariants(*m), "");
  ASSERT_OK(engine.verify(*a.cache, a.fake));
}

}  // namespace
}  // namespace hybridkv
