// Sliding-window semantics (issue 11, items 1 and 2): a window of W tokens is the current token
// and the W - 1 before it; pages that leave the window stay HELD until the commit that covers
// them, so a sliding-window model's shared system prompt is reusable in full.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "bundled_models.h"
#include "hybridkv/manager.h"
#include "hybridkv/model.h"
#include "hybridkv/testing/inspect.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

constexpr uint32_t kTpb = 32;

ManagerConfig window_model_config(const std::string& file) {
  Result<ModelDescription> m = read_model_config(testing::bundled_model_path(file), {});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  ManagerConfig c;
  c.tokens_per_block = kTpb;
  c.attention_layers = m.value().attention_layer_configs(kTpb);
  c.commit_min_snapshot = false;  // pages leaving the window wait for their commit
  c.tiers.push_back({TierKind::kGpu, 1, ""});
  return c;
}

std::vector<int32_t> tokens_from(uint32_t seed, uint64_t n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % 50000);
  return out;
}

TEST(Window, CurrentTokenAndTheWMinusOneBeforeItAreLive) {
  ManagerConfig c = window_model_config("gpt_oss_20b.json");  // window 128
  const StoragePlan plan = *StoragePlan::build(c);
  const CacheGroup& w = plan.cache_groups()[1];
  ASSERT_EQ(w.window, 128u);
  // History 160: the token computed is 160; it reads 33..160, so block 1 (tokens 32..63) is
  // the first live block and block 0 is stale. The old rule (W tokens back, from 32) kept 0..
  EXPECT_EQ(w.first_live_token(160), 33u);
  EXPECT_EQ(w.first_live_block(160, kTpb), 1u);
  // History 159 reads 32..159: block 1 as well; history 127 reads from token 0.
  EXPECT_EQ(w.first_live_token(159), 32u);
  EXPECT_EQ(w.first_live_token(127), 0u);
  EXPECT_EQ(w.first_live_token(128), 1u);
  // 128 consecutive tokens touch at most ceil(127 / 32) + 1 = 5 blocks.
  EXPECT_EQ(w.one_request_slots, 5u);
  // A window of 33 tokens touches ceil(32 / 32) + 1 = 2 blocks, not 3.
  c.attention_layers[0].window = 33;
  EXPECT_EQ(StoragePlan::build(c).value().cache_groups()[1].one_request_slots, 2u);
}

TEST(Window, MatchNeedsPagesOnlyForTheWMinusOneTokensBeforeItsEnd) {
  ManagerConfig c = window_model_config("gpt_oss_20b.json");
  c.tiers[0].quota_bytes = 256ull << 20;
  auto m = std::move(KvCacheManager::create(c, {BackendKind::kNone})).value();
  const std::vector<int32_t> prompt = tokens_from(1, 200);
  auto a = std::move(m->create_kv_cache({{}, prompt, 1, {}, {}, {}})).value();
  ASSERT_OK(a->resume({}));
  ASSERT_OK(a->resize(200, 0));
  ASSERT_OK(a->resize(200, 200));
  ASSERT_OK(a->commit(prompt));
  ASSERT_OK(a->close());
  // A new prompt sharing 160 tokens: endpoint 160 (5 blocks). The window group needs the 127
  // tokens 33..159 before it: blocks 1..4, all published by the commit, so the match is whole.
  std::vector<int32_t> b_prompt(prompt.begin(), prompt.begin() + 160);
  b_prompt.push_back(-1);
  const ReuseMatch match = m->probe_reuse({}, b_prompt);
  EXPECT_EQ(match.reused_tokens, 160u);
  EXPECT_EQ(match.groups[1].endpoint, 160u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// Request 0 prefills (system prompt + its own question) in `chunk`-token steps, committing at
// each step's end; requests 1..7 share the system prompt. Each reuses it in full, rounded down
// to whole blocks, and all eight are ACTIVE together.
void expect_system_prompt_reused(const std::string& file, uint64_t system, uint64_t chunk) {
  SCOPED_TRACE(file + ": system prompt " + std::to_string(system) + ", chunk " +
               std::to_string(chunk));
  constexpr uint64_t kBatch = 8, kQuestion = 200;
  ManagerConfig c = window_model_config(file);
  const uint64_t len = system + kQuestion;
  // The batch that must fit: eight requests prefilling their prompts in one step each (the
  // shared prefix's full blocks stored once).
  c.constraints.push_back(BatchShape{std::vector<RequestShape>(kBatch, {len, 0}), system});
  auto m = std::move(KvCacheManager::create(c, {BackendKind::kNone})).value();
  const std::vector<int32_t> shared = tokens_from(7, system);
  std::vector<std::unique_ptr<KvCache>> caches;
  for (uint32_t r = 0; r < kBatch; ++r) {
    std::vector<int32_t> prompt = shared;
    const std::vector<int32_t> own = tokens_from(100 + r, kQuestion);
    prompt.insert(prompt.end(), own.begin(), own.end());
    auto cache = std::move(m->create_kv_cache({{}, prompt, 1, {}, {}, {}})).value();
    const uint64_t reused = cache->reuse_match().reused_tokens;
    EXPECT_EQ(reused, r == 0 ? 0 : system / kTpb * kTpb) << "request " << r;
    ASSERT_OK(cache->resume({}));
    const std::span<const int32_t> all(prompt);
    for (uint64_t h = cache->history(); h < len;) {
      const uint64_t end = std::min(len, h + chunk);
      ASSERT_OK(cache->resize(end, h));  // the step computes [h, end)
      ASSERT_OK(cache->resize(end, end));
      const uint64_t committed = cache->committed_tokens();
      ASSERT_OK(cache->commit(all.subspan(committed, end - committed)));
      h = end;
    }
    caches.push_back(std::move(cache));
  }
  for (const auto& cache : caches) EXPECT_EQ(cache->state(), CacheState::kActive);
  EXPECT_EQ(m->storage_stats().active_caches, kBatch);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST(Window, SharedSystemPromptIsReusedInFullByGptOss) {
  for (uint64_t system : {100u, 1000u, 5000u}) {
    expect_system_prompt_reused("gpt_oss_20b.json", system, 1u << 20);  // one chunk
    expect_system_prompt_reused("gpt_oss_20b.json", system, 256);       // several
  }
}

TEST(Window, SharedSystemPromptIsReusedInFullByGemma3) {
  for (uint64_t system : {100u, 1000u, 5000u}) {
    expect_system_prompt_reused("gemma_3_12b.json", system, 1u << 20);
    expect_system_prompt_reused("gemma_3_12b.json", system, 512);
  }
}

TEST(Window, PagesLeavingTheWindowAreHeldUntilTheirCommit) {
  ManagerConfig c = window_model_config("gpt_oss_20b.json");
  c.tiers[0].quota_bytes = 256ull << 20;
  auto m = std::move(KvCacheManager::create(c, {BackendKind::kNone})).value();
  const std::vector<int32_t> prompt = tokens_from(3, 320);
  auto a = std::move(m->create_kv_cache({{}, prompt, 1, {}, {}, {}})).value();
  ASSERT_OK(a->resume({}));
  ASSERT_OK(a->resize(320, 0));
  const uint64_t free_before = m->storage_stats().tiers[0].pool_groups[0].free_slots;
  // History 320 reads 193..319: window blocks 0..5 leave the window; they stay (HELD) and the
  // kernels see kBadPageIndex for them.
  ASSERT_OK(a->resize(320, 320));
  EXPECT_EQ(m->storage_stats().tiers[0].pool_groups[0].free_slots, free_before);
  const std::span<const int32_t> table = *a->block_table(CacheGroupId(1));
  for (uint64_t b = 0; b < 6; ++b) EXPECT_EQ(table[b], kBadPageIndex) << "block " << b;
  EXPECT_NE(table[6], kBadPageIndex);
  // Committing the first 192 tokens publishes blocks 0..5 and frees the cache's holds: the
  // pages stay in the tree (DROPPABLE, evictable), not in the free list.
  const std::span<const int32_t> all(prompt);
  ASSERT_OK(a->commit(all));
  const PoolGroupStorage after = m->storage_stats().tiers[0].pool_groups[0];
  EXPECT_EQ(after.free_slots, free_before);
  EXPECT_EQ(after.evictable_slots, 6u);
  // With commit_min_snapshot (issue 31): the prompt's pages wait for their commit as well, so
  // every committed endpoint stays reusable; pages of generated tokens past the prompt are
  // freed at once (a long decode does not pile them up until its answer is committed).
  c.commit_min_snapshot = true;
  auto m2 = std::move(KvCacheManager::create(c, {BackendKind::kNone})).value();
  auto b = std::move(m2->create_kv_cache({{}, prompt, 1, {}, {}, {}})).value();
  ASSERT_OK(b->resume({}));
  ASSERT_OK(b->resize(320, 0));
  const uint64_t free2 = m2->storage_stats().tiers[0].pool_groups[0].free_slots;
  ASSERT_OK(b->resize(320, 320));
  EXPECT_EQ(m2->storage_stats().tiers[0].pool_groups[0].free_slots, free2);
  ASSERT_OK(b->commit(all));
  EXPECT_EQ(m2->storage_stats().tiers[0].pool_groups[0].evictable_slots, 6u);
  ASSERT_OK(b->close());
  auto d = std::move(m2->create_kv_cache({{}, tokens_from(4, 32), 1, {}, {}, {}})).value();
  ASSERT_OK(d->resume({}));
  ASSERT_OK(d->resize(32, 0));
  ASSERT_OK(d->resize(320, 32));  // generating past its 32-token prompt
  const uint64_t free3 = m2->storage_stats().tiers[0].pool_groups[0].free_slots;
  ASSERT_OK(d->resize(320, 320));
  // Block 0 is the prompt's (HELD for its commit); blocks 1..5 were generated: freed.
  EXPECT_EQ(m2->storage_stats().tiers[0].pool_groups[0].free_slots, free3 + 5);
  EXPECT_EQ(testing::check_invariants(*m), "");
  EXPECT_EQ(testing::check_invariants(*m2), "");
}

}  // namespace
}  // namespace hybridkv
