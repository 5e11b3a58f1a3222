// Where the hybrid manager takes snapshots and what it publishes: periodic, aligned-end, branch
// and demand points, KV published at every chunk, and commit_answer for chat.
#include <gtest/gtest.h>

#include "bundled_models.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/testing/inspect.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

ModelDescription model(const std::string& file, uint32_t tp = 1) {
  return testing::bundled_model(file, tp);
}

// Two requests per step, 16-token blocks, 1 GiB of GPU: the snapshot-placement tests' setting.
ServingConfig small_serving() {
  ServingConfig s;
  s.max_batch = 2;
  s.tokens_per_block = 16;
  s.tiers = {{TierKind::kGpu, 1ull << 30, ""}};
  return s;
}

TEST(HybridSnapshots, NextPointFollowsThePolicy) {
  ServingConfig s = small_serving();
  s.snapshots.periodic_interval = 512;
  s.snapshots.offsets_from_start = {100};
  s.snapshots.offsets_from_end = {64};
  auto h =
      std::move(HybridCacheManager::create(model("nemotron_h_8b.json", 8), s, {BackendKind::kNone}))
          .value();
  std::vector<int32_t> prompt(2000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  ASSERT_OK(h->add_request(1, prompt));
  ASSERT_OK(h->resume(1));
  std::vector<uint64_t> points;
  for (uint64_t at = 0; at < prompt.size();) {
    const uint64_t next = *h->next_snapshot_point(1);
    points.push_back(next);
    ASSERT_OK(h->resize(1, next, at));
    ASSERT_OK(h->resize(1, next, next));
    ASSERT_OK(h->commit_at_snapshot(1));
    EXPECT_EQ(h->cache(1)->committed_tokens(), next);  // commits happen at snapshot points
    at = next;
  }
  EXPECT_EQ(points, (std::vector<uint64_t>{100, 512, 1024, 1536, 1936, 2000}));
  ASSERT_OK(h->free_request(1));
  // A later prompt sharing 1,000 tokens reuses up to the snapshot at 512 (periodic).
  std::vector<int32_t> fork(prompt.begin(), prompt.begin() + 1200);
  fork[1000] = -5;
  ASSERT_OK(h->add_request(2, fork));
  EXPECT_EQ(h->cache(2)->reuse_match().reused_tokens, 512u);
}

TEST(HybridSnapshots, AlignedEndSnapshotsAtTheLastGrainAndKvIsPublishedAtEveryChunk) {
  ServingConfig s = small_serving();
  s.snapshots.aligned_end = 512;
  s.snapshots.final_prompt_boundary = false;
  auto h =
      std::move(HybridCacheManager::create(model("nemotron_h_8b.json", 8), s, {BackendKind::kNone}))
          .value();
  std::vector<int32_t> prompt(1300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  ASSERT_OK(h->add_request(1, prompt));
  ASSERT_OK(h->resume(1));
  // 1,300 tokens: the last multiple of 512 inside is 1,024; then the prompt's end.
  EXPECT_EQ(*h->next_snapshot_point(1), 1024u);
  // A chunk of 300 tokens ends at no snapshot point: its 18 full blocks (288 tokens) are
  // published all the same, with no state; nothing is reusable without a snapshot.
  ASSERT_OK(h->resize(1, 300, 0));
  ASSERT_OK(h->resize(1, 300, 300));
  ASSERT_OK(h->commit_at_snapshot(1));
  EXPECT_EQ(h->cache(1)->committed_tokens(), 300u);
  EXPECT_EQ(testing::tree_pages(h->manager()).size(), 18u);
  ASSERT_OK(h->resize(1, 1024, 300));
  ASSERT_OK(h->resize(1, 1024, 1024));
  ASSERT_OK(h->commit_at_snapshot(1));  // 1,024: KV and the state
  ASSERT_OK(h->resize(1, 1300, 1024));
  ASSERT_OK(h->resize(1, 1300, 1300));
  ASSERT_OK(h->commit_at_snapshot(1));  // no-end: the KV of blocks up to 1,296 only
  EXPECT_EQ(h->cache(1)->committed_tokens(), 1300u);
  ASSERT_OK(h->free_request(1));
  // The next turn repeats the prompt and more: it resumes from the snapshot at 1,024.
  std::vector<int32_t> next(prompt);
  next.resize(1600, 9);
  ASSERT_OK(h->add_request(2, next));
  EXPECT_EQ(h->cache(2)->reuse_match().reused_tokens, 1024u);
  EXPECT_EQ(h->cache(2)->reuse_match().hybrid_tokens, 1296u);  // KV past the snapshot is there
}

// Chat: the next turn repeats the prompt and the answer; commit_answer snapshots at the
// answer's end, so the next turn resumes there instead of at the prompt.
TEST(HybridSnapshots, CommitAnswerLetsTheNextTurnResumeAfterTheAnswer) {
  ServingConfig s = small_serving();
  s.snapshots.final_prompt_boundary = false;
  s.snapshots.answer_end = true;
  auto h =
      std::move(HybridCacheManager::create(model("nemotron_h_8b.json", 8), s, {BackendKind::kNone}))
          .value();
  std::vector<int32_t> prompt(300), answer(50);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  for (size_t i = 0; i < answer.size(); ++i) answer[i] = static_cast<int32_t>(7000 + i);
  ASSERT_OK(h->add_request(1, prompt));
  ASSERT_OK(h->resume(1));
  EXPECT_EQ(h->commit_answer(1, answer).code(), StatusCode::kFailedPrecondition);  // no prefill
  ASSERT_OK(h->resize(1, 300, 0));
  ASSERT_OK(h->resize(1, 300, 300));
  ASSERT_OK(h->commit_at_snapshot(1));  // no snapshot point: KV only
  // Decode 49 of the 50 answer tokens (the last one's KV is never computed).
  ASSERT_OK(h->resize(1, 349, 300));
  ASSERT_OK(h->resize(1, 349, 349));
  EXPECT_EQ(h->commit_answer(1, std::span(answer).first(10)).code(),
            StatusCode::kInvalidArgument);  // does not cover what the cache computed
  ASSERT_OK(h->commit_answer(1, answer));
  EXPECT_EQ(h->cache(1)->committed_tokens(), 349u);
  ASSERT_OK(h->free_request(1));
  std::vector<int32_t> next(prompt);
  next.insert(next.end(), answer.begin(), answer.end());
  next.resize(500, 9);
  ASSERT_OK(h->add_request(2, next));
  EXPECT_EQ(h->cache(2)->reuse_match().reused_tokens, 349u);
}

TEST(HybridSnapshots, BranchAndDemandPointsEndChunksWhereTheTreeForksOrWasWanted) {
  ServingConfig s = small_serving();
  s.snapshots.branch_point = true;
  s.snapshots.demand_driven = true;
  s.enable_partial_reuse = false;  // matches stop at block boundaries: 288, not 300
  auto h =
      std::move(HybridCacheManager::create(model("nemotron_h_8b.json", 8), s, {BackendKind::kNone}))
          .value();
  std::vector<int32_t> prompt(600);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  auto prefill = [&](uint64_t id) {
    ASSERT_OK(h->resume(id));
    for (uint64_t at = h->cache(id)->history();
         at < h->cache(id)->reuse_match().lookup_tokens + 1;) {
      const uint64_t next = *h->next_snapshot_point(id);
      ASSERT_OK(h->resize(id, next, at));
      ASSERT_OK(h->resize(id, next, next));
      ASSERT_OK(h->commit_at_snapshot(id));
      at = next;
    }
  };
  ASSERT_OK(h->add_request(1, prompt));
  ASSERT_NO_FATAL_FAILURE(prefill(1));  // snapshot only at the end (600)
  std::vector<int32_t> fork = prompt;
  fork[300] = -1;
  ASSERT_OK(h->add_request(2, fork));
  // Attention could reuse the 18 full blocks before the change at 300, but there is no snapshot
  // before 600: nothing is reused...
  EXPECT_EQ(h->cache(2)->reuse_match().reused_tokens, 0u);
  EXPECT_EQ(h->cache(2)->reuse_match().hybrid_tokens, 288u);
  // ...so the fork snapshots at its branch point (also a demand point).
  EXPECT_EQ(*h->next_snapshot_point(2), 288u);
  ASSERT_NO_FATAL_FAILURE(prefill(2));
  std::vector<int32_t> third = prompt;
  third[400] = -2;
  ASSERT_OK(h->add_request(3, third));
  EXPECT_EQ(h->cache(3)->reuse_match().reused_tokens, 288u);  // the fork's branch snapshot
  EXPECT_EQ(*h->next_snapshot_point(3), 400u);                // its own branch point
}

}  // namespace
}  // namespace hybridkv
