// Commits and planned drops (issue 11 items 7, 8, 11): where a commit may start or end, what a
// planned snapshot drop covers, and the drop handle as a value.
#include <gtest/gtest.h>

#include <algorithm>

#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::advance;
using testing::commit_computed;
using testing::LifecycleModel;
using testing::make_manager;
using testing::make_request;
using testing::random_tokens;
using testing::Request;

constexpr CacheGroupId kWindow(3);

class Reuse : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{42};
};

TEST_F(Reuse, PlannedDropsAreCountedPerEndpoint) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 64);
  Request b = make_request(*m, tokens, 64);
  std::vector<PlannedDrop> drops;
  for (Request* r : {&a, &b}) {
    ASSERT_OK(r->cache->resume({}));
    ASSERT_OK(advance(engine, *r, 64));
    ASSERT_OK(r->cache->resize(64, 64));
    ASSERT_OK(commit_computed(*r));
    Result<PlannedDrop> drop = r->cache->plan_snapshot_drop();
    ASSERT_TRUE(drop.is_ok()) << drop.status().to_string();
    drops.push_back(drop.value());
  }
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 64u);
  ASSERT_OK(drops[0].release());
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 64u);  // B's plan still targets it
  ASSERT_OK(b.cache->close());  // closing does not run B's plan: the handle does
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 64u);
  ASSERT_OK(drops[1].release());
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 0u);  // the snapshot at 64 is gone
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, PlannedDropIsAValueThatOutlivesItsCacheAndReportsASecondRelease) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  PlannedDrop drop;
  EXPECT_EQ(drop.release().code(), StatusCode::kNotFound);  // names no plan
  {
    Request a = make_request(*m, tokens, 64);
    ASSERT_OK(a.cache->resume({}));
    ASSERT_OK(advance(engine, a, 64));
    ASSERT_OK(a.cache->resize(64, 64));
    ASSERT_OK(commit_computed(a));
    drop = a.cache->plan_snapshot_drop().value();
  }  // the cache is destroyed (closed); the plan stays
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 64u);
  const PlannedDrop copy = drop;
  m.reset();  // the manager is gone too: the handle keeps the pools
  ASSERT_OK(drop.release());
  const Status again = copy.release();
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_NE(again.message().find("was already dropped"), std::string::npos) << again.message();
}

TEST_F(Reuse, PlannedDropCoversTheWholeWindowOfItsSnapshot) {
  // LifecycleModel: 16 tokens a block, window 48. A commit of 96 tokens ends at block 6; a
  // match ending at 96 reads tokens 49..95 of the window group: blocks 3, 4 and 5.
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 200);
  Request a = make_request(*m, tokens, 96);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 96));
  ASSERT_OK(a.cache->resize(96, 96));
  ASSERT_OK(commit_computed(a));
  const PlannedDrop drop = a.cache->plan_snapshot_drop().value();
  ASSERT_OK(a.cache->close());
  const std::vector<testing::TreePage> before = testing::tree_pages(*m);
  ASSERT_OK(drop.release());
  const std::vector<testing::TreePage> after = testing::tree_pages(*m);
  // Gone: the SSM snapshots at 96 and the window pages of blocks 3..5; the full-attention
  // pages and window blocks 0..2 stay.
  auto window_blocks = [&](const std::vector<testing::TreePage>& pages) {
    std::vector<uint64_t> out;
    for (const testing::TreePage& p : pages)
      if (p.group == kWindow) out.push_back(p.start / 16);
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(window_blocks(before), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(window_blocks(after), (std::vector<uint64_t>{}));
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 0u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, CommitsOnlyComputedPromptTokensAndNoneAfterStopCommitting) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  Request a = make_request(*m, tokens, 64);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 40));
  ASSERT_OK(a.cache->resize(40, 40));
  const std::span<const int32_t> all(tokens);
  EXPECT_EQ(a.cache->commit(all.first(41)).code(), StatusCode::kInvalidArgument);  // past history
  // A token that is not the request's is named with both values (the first that differs).
  for (const size_t at : {size_t{0}, size_t{3}, size_t{39}}) {
    std::vector<int32_t> wrong(tokens.begin(), tokens.begin() + 40);
    wrong[at] += 1;
    if (at == 3) wrong[20] += 1;
    const Status s = a.cache->commit(wrong);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(
        s.message().find("commit token " + std::to_string(at) + " is " + std::to_string(wrong[at]) +
                         " but the request has " + std::to_string(tokens[at])),
        std::string::npos)
        << s.message();
    EXPECT_EQ(a.cache->committed_tokens(), 0u);  // refused: nothing changed
  }
  ASSERT_OK(a.cache->commit(all.first(40)));
  EXPECT_EQ(a.cache->committed_tokens(), 40u);
  ASSERT_OK(a.cache->stop_committing());
  EXPECT_EQ(a.cache->commit(all.subspan(40, 8)).code(), StatusCode::kFailedPrecondition);
}

TEST_F(Reuse, CommitMustStartOrEndAtHistory) {
  LifecycleModel model;
  model.commit_min_snapshot = false;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  const std::span<const int32_t> all(tokens);
  Request a = make_request(*m, tokens, 64);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 40));
  ASSERT_OK(a.cache->resize(64, 40));
  // committed 0, history 40: [0, 16) neither starts nor ends at 40.
  const Status mid = a.cache->commit(all.first(16));
  EXPECT_EQ(mid.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mid.message().find("must start or end at history"), std::string::npos) << mid.message();
  ASSERT_OK(a.cache->commit(all.first(40)));  // ends at history
  // Starts at history 40: the tokens the current step computes, up to capacity 64.
  EXPECT_EQ(a.cache->commit(all.subspan(40, 25)).code(), StatusCode::kInvalidArgument);  // 65
  ASSERT_OK(a.cache->commit(all.subspan(40, 24)));
  EXPECT_EQ(a.cache->committed_tokens(), 64u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST_F(Reuse, CommitWithMinSnapshotMustEndAtHistory) {
  auto m = make_manager(LifecycleModel{});  // commit_min_snapshot on
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  const std::span<const int32_t> all(tokens);
  Request a = make_request(*m, tokens, 64);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 40));
  ASSERT_OK(a.cache->resize(64, 40));
  ASSERT_OK(a.cache->commit(all.first(40)));
  // Starting at history is not enough: a snapshot is exact only at history.
  const Status s = a.cache->commit(all.subspan(40, 8));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("with commit_min_snapshot a commit must end at history"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(a.cache->committed_tokens(), 40u);
}

TEST_F(Reuse, CommitKvPublishesFullBlocksWithoutStates) {
  // LifecycleModel: 16 tokens a block, commit_min_snapshot on.
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 120);
  Request a = make_request(*m, tokens, 100);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 100));
  ASSERT_OK(a.cache->resize(100, 100));
  const std::span<const int32_t> all(tokens);
  // 100 tokens: six full blocks of KV published; no tail, no snapshot, so no match restores.
  ASSERT_OK(a.cache->commit_kv(all.first(100)));
  EXPECT_EQ(a.cache->committed_tokens(), 100u);
  size_t kv = 0, states = 0;
  for (const testing::TreePage& t : testing::tree_pages(*m)) ++(t.group.value < 2 ? states : kv);
  // Full attention: blocks 0..5; the 48-token window: from history 100 a step reads tokens
  // 53.., so blocks 3..5 (0..2 were freed as they left it, commit_min_snapshot being on).
  EXPECT_EQ(kv, 6u + 3u);
  EXPECT_EQ(states, 0u);
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 0u);
  EXPECT_EQ(m->probe_reuse({}, tokens).hybrid_tokens, 96u);
  // The snapshot commit at the next point adds the states.
  ASSERT_OK(advance(engine, a, 112));
  ASSERT_OK(a.cache->resize(112, 112));
  ASSERT_OK(a.cache->commit(all.subspan(100, 12)));
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 112u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

}  // namespace
}  // namespace hybridkv
