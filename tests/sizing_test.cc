// Every path that counts slots (build, estimate, minimum, token sizing) counts the same slots.
#include <gtest/gtest.h>

#include <random>

#include "hybridkv/manager.h"
#include "hybridkv/plan.h"
#include "test_configs.h"

namespace hybridkv {
namespace {

using testing::example_config;

ManagerConfig with_gpu_quota(ManagerConfig c, uint64_t quota) {
  c.tiers[0].quota_bytes = quota;
  return c;
}

TEST(Sizing, BuildAndEstimateAgreeAtRandomQuotas) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 300; ++i) {
    ManagerConfig c = example_config();
    if (rng() % 2) c.max_live_kv_caches = 1 + rng() % 64;
    if (rng() % 3 == 0) c.enable_block_reuse = false;
    if (rng() % 3 == 0) c.max_util_for_resume = 0.5 + (rng() % 50) / 100.0;
    const uint64_t quota = 1 + rng() % (64ull << 20);
    c = with_gpu_quota(c, quota);
    SCOPED_TRACE("seed " + std::to_string(seed) + " iteration " + std::to_string(i));
    Result<StoragePlan> plan = StoragePlan::build(c);
    ASSERT_TRUE(plan.is_ok());
    Result<std::vector<uint64_t>> estimate = estimate_slots(c, TierKind::kGpu, quota);
    ASSERT_TRUE(estimate.is_ok());
    EXPECT_EQ(plan->tier(TierKind::kGpu)->slots, *estimate);
    // Every pool group gets at least its floor, and the slots fit in the quota.
    for (const PoolGroup& pg : plan->pool_groups()) {
      EXPECT_GE(plan->slots(TierKind::kGpu, pg.id), pg.floor_slots);
    }
    EXPECT_LE(plan->tier(TierKind::kGpu)->bytes_used, plan->tier(TierKind::kGpu)->quota);
  }
}

TEST(Sizing, MinimumQuotaIsExactlyWhereTheRaiseStops) {
  ManagerConfig c = example_config();
  c.ssm_layers[0].buffers[0].bytes_per_page = 64ull << 20;
  c.max_live_kv_caches = 19;
  const uint64_t minimum = *minimum_gpu_quota(c);
  EXPECT_FALSE(StoragePlan::build(with_gpu_quota(c, minimum))->tier(TierKind::kGpu)->quota_raised);
  const uint64_t below = minimum - tier_grain(TierKind::kGpu, minimum);
  EXPECT_TRUE(StoragePlan::build(with_gpu_quota(c, below))->tier(TierKind::kGpu)->quota_raised);
  // The raised plan equals the plan built at the minimum.
  EXPECT_EQ(StoragePlan::build(with_gpu_quota(c, below))->tier(TierKind::kGpu)->slots,
            StoragePlan::build(with_gpu_quota(c, minimum))->tier(TierKind::kGpu)->slots);
}

TEST(Sizing, NineteenAtPointNineFiveIsTwentyInEveryPath) {
  ManagerConfig c = example_config();
  c.max_live_kv_caches = 19;
  c.enable_block_reuse = false;
  const StoragePlan plan = *StoragePlan::build(c);
  EXPECT_EQ(plan.pool_groups()[0].floor_slots, 20u);  // live floor
  EXPECT_EQ(plan.pool_groups()[1].floor_slots, 20u);  // fixed PRIVATE pool
  EXPECT_EQ(plan.slots(TierKind::kGpu, PoolGroupId(0)), 20u);
  EXPECT_EQ((*estimate_slots(c, TierKind::kGpu, c.tiers[0].quota_bytes))[0], 20u);
}

TEST(Sizing, QuotaForTokensAndItsInverseAgree) {
  ManagerConfig c = example_config();
  c.max_live_kv_caches = 8;
  for (uint64_t tokens : {1ull, 100ull, 5000ull, 123457ull, 2000000ull}) {
    SCOPED_TRACE(tokens);
    const uint64_t quota = *quota_for_tokens(c, tokens);
    EXPECT_GE(*max_tokens_for_quota(c, quota), tokens);
    const StoragePlan plan = *StoragePlan::build(with_gpu_quota(c, quota));
    EXPECT_GE(plan.gpu_kv_tokens().value(), tokens);
    if (quota > *minimum_gpu_quota(c)) {
      // One smallest grain less no longer holds them.
      EXPECT_LT(*max_tokens_for_quota(c, quota - (2ull << 20)), tokens);
    }
  }
}

TEST(Sizing, MaxTokensGrowWithTheQuota) {
  const ManagerConfig c = example_config();
  uint64_t previous = 0;
  for (uint64_t mib = 2; mib <= 512; mib *= 2) {
    const uint64_t tokens = *max_tokens_for_quota(c, mib << 20);
    EXPECT_GE(tokens, previous);
    previous = tokens;
  }
  EXPECT_GT(previous, 0u);
}

TEST(Sizing, KvTokensCountFullAttentionBlocksAtUtil) {
  // Default example at 2 MiB: 497 full-attention slots; floor(497 x .95) = 472 blocks of 16.
  const StoragePlan plan = *StoragePlan::build(example_config());
  EXPECT_EQ(plan.gpu_kv_tokens(), 472u * 16);
  EXPECT_EQ(*max_tokens_for_quota(example_config(), 2u << 20), 472u * 16);
}

TEST(Sizing, ClampMaxSeqLenForMemory) {
  const ManagerConfig c = example_config();
  // One request owns every usable full-attention slot: 472 blocks x 16 tokens.
  EXPECT_EQ(*clamp_max_seq_len_for_mem(c, 2u << 20, 1u << 20), 472u * 16);
  EXPECT_EQ(*clamp_max_seq_len_for_mem(c, 2u << 20, 1000), 1000u);
}

TEST(Sizing, ClampMaxSeqLenForABatchSharesTheSlots) {
  // Example plan at 2 MiB (util 0.95): state pool group 3 slots -> 2 usable; PRIVATE replay
  // 3 -> 2; full attention 497 -> 472; windows 19 -> 18, 3 + 4 = 7 per request.
  auto m = std::move(KvCacheManager::create(example_config(), {BackendKind::kNone})).value();
  // Batch 1: all 472 full-attention blocks: 7,552 tokens (the single-request clamp).
  EXPECT_EQ(*m->clamp_max_seq_len(1, 1u << 20), 472u * 16);
  EXPECT_EQ(m->clamp_max_seq_len_for_mem(1u << 20), 472u * 16);
  // Batch 2: 472 / 2 = 236 blocks each: 3,776 tokens (windows 2 x 7 = 14 <= 18, states 2 <= 2).
  EXPECT_EQ(*m->clamp_max_seq_len(2, 1u << 20), 236u * 16);
  EXPECT_EQ(*m->clamp_max_seq_len(2, 1000), 1000u);
  // Batch 3: three states do not fit in 2 usable slots: no length does.
  EXPECT_EQ(*m->clamp_max_seq_len(3, 1u << 20), 0u);
  EXPECT_FALSE(m->clamp_max_seq_len(0, 100).is_ok());
}

TEST(Sizing, ModelWithoutAttentionHasNoTokenSizing) {
  ManagerConfig c = example_config();
  c.attention_layers.clear();
  EXPECT_FALSE(quota_for_tokens(c, 100).is_ok());
  EXPECT_FALSE(max_tokens_for_quota(c, 1u << 30).is_ok());
  EXPECT_EQ(*clamp_max_seq_len_for_mem(c, 1u << 30, 4096), 4096u);
}

TEST(Sizing, InvalidConfigFailsEveryPathAlike) {
  ManagerConfig c = example_config();
  c.tokens_per_block = 0;
  EXPECT_FALSE(estimate_slots(c, TierKind::kGpu, 1 << 30).is_ok());
  EXPECT_FALSE(minimum_gpu_quota(c).is_ok());
  EXPECT_FALSE(quota_for_tokens(c, 10).is_ok());
  EXPECT_FALSE(max_tokens_for_quota(c, 1 << 30).is_ok());
  EXPECT_FALSE(clamp_max_seq_len_for_mem(c, 1 << 30, 10).is_ok());
}

}  // namespace
}  // namespace hybridkv
