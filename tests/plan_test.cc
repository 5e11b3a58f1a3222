// Cache groups, storage layout, addressing and slot counts against hand-computed numbers.
#include <gtest/gtest.h>

#include "hybridkv/plan.h"
#include "test_configs.h"

namespace hybridkv {
namespace {

using testing::example_config;

StoragePlan build_ok(const ManagerConfig& c) {
  Result<StoragePlan> plan = StoragePlan::build(c);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  return std::move(plan).value();
}

std::vector<uint64_t> gpu_slots(const StoragePlan& plan) {
  return plan.tier(TierKind::kGpu)->slots;
}

// --- Cache groups ---

TEST(CacheGroups, ExampleGroupsHaveDeterministicIdsInDesignOrder) {
  const StoragePlan plan = build_ok(example_config());
  const auto& g = plan.cache_groups();
  ASSERT_EQ(g.size(), 5u);
  EXPECT_EQ(g[0].kind, GroupKind::kSsm);
  EXPECT_EQ(g[0].policy, ReusePolicy::kRequired);
  EXPECT_EQ(g[1].kind, GroupKind::kSsm);
  EXPECT_EQ(g[1].policy, ReusePolicy::kPrivate);
  EXPECT_EQ(g[2].kind, GroupKind::kAttention);
  EXPECT_FALSE(g[2].window.has_value());
  EXPECT_EQ(g[3].window, 32u);
  EXPECT_EQ(g[3].sink_blocks, 0u);
  EXPECT_EQ(g[4].window, 32u);
  EXPECT_EQ(g[4].sink_blocks, 1u);  // ceil(4 / 16)
}

TEST(CacheGroups, IdsDoNotDependOnLayerOrder) {
  ManagerConfig c = example_config();
  std::reverse(c.attention_layers.begin(), c.attention_layers.end());
  std::reverse(c.ssm_layers[0].buffers.begin(), c.ssm_layers[0].buffers.end());
  const StoragePlan a = build_ok(example_config());
  const StoragePlan b = build_ok(c);
  EXPECT_EQ(a.layer_grouping(), b.layer_grouping());
  for (const PlannedBuffer& buffer : a.buffers()) {
    EXPECT_EQ(b.buffer_group_id(buffer.layer, buffer.role)->value, buffer.group.value);
  }
}

TEST(CacheGroups, BufferPolicyOverridesAndInheritsLayerPolicy) {
  const StoragePlan plan = build_ok(example_config());
  EXPECT_EQ(plan.buffer_group_id(0, "ssm_state")->value, 0u);  // inherits REQUIRED
  EXPECT_EQ(plan.buffer_group_id(0, "conv_state")->value, 0u);
  EXPECT_EQ(plan.buffer_group_id(0, "replay_row")->value, 1u);  // own PRIVATE override
  EXPECT_EQ(plan.buffer_group_id(1, "key")->value, 2u);
  EXPECT_EQ(plan.buffer_group_id(2, "value")->value, 3u);
  EXPECT_EQ(plan.buffer_group_id(3, "key")->value, 4u);
  EXPECT_EQ(plan.buffer_group_id(7, "key").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(plan.buffer_group_id(1, "ssm_state").status().code(), StatusCode::kNotFound);
}

TEST(CacheGroups, SplitLayerFailsLayerLookupWithClearError) {
  const StoragePlan plan = build_ok(example_config());
  Result<CacheGroupId> split = plan.layer_group_id(0);
  ASSERT_FALSE(split.is_ok());
  EXPECT_EQ(split.status().message(),
            "layer 0 is split across cache groups 0, 1; use buffer_group_id(layer, role)");
  EXPECT_EQ(plan.layer_group_id(1)->value, 2u);
  EXPECT_EQ(plan.layer_group_id(3)->value, 4u);
  EXPECT_EQ(plan.layer_group_id(9).status().code(), StatusCode::kNotFound);
}

TEST(CacheGroups, GroupingsListBuffersAndLayersPerGroup) {
  const StoragePlan plan = build_ok(example_config());
  const auto buffers = plan.buffer_grouping();
  ASSERT_EQ(buffers.size(), 5u);
  EXPECT_EQ(buffers[0], (std::vector<BufferKey>{{0, "ssm_state"}, {0, "conv_state"}}));
  EXPECT_EQ(buffers[1], (std::vector<BufferKey>{{0, "replay_row"}}));
  EXPECT_EQ(buffers[2], (std::vector<BufferKey>{{1, "key"}, {1, "value"}}));
  const auto layers = plan.layer_grouping();
  EXPECT_EQ(layers[0], std::vector<LayerId>{0});
  EXPECT_EQ(layers[1], std::vector<LayerId>{0});
  EXPECT_EQ(layers[4], std::vector<LayerId>{3});
}

TEST(CacheGroups, ZeroSizeBufferIsDroppedWithoutChangingTheLayerPolicy) {
  ManagerConfig c = example_config();
  c.ssm_layers[0].buffers[2].bytes_per_page = 0;  // the PRIVATE replay row disappears
  StoragePlan plan = build_ok(c);
  EXPECT_EQ(plan.cache_groups().size(), 4u);
  EXPECT_EQ(plan.layer_group_id(0)->value, 0u);  // no longer split
  EXPECT_EQ(plan.cache_group(CacheGroupId(0)).policy, ReusePolicy::kRequired);

  // A zero-size buffer with another policy does not create its group either.
  c = example_config();
  c.attention_layers[0].buffers.push_back({"indexer_k", 0, ReusePolicy::kOptional, {}});
  plan = build_ok(c);
  EXPECT_EQ(plan.cache_groups().size(), 5u);
}

TEST(CacheGroups, SsmGroupsDeduplicateByPolicyAcrossLayers) {
  ManagerConfig c = example_config();
  SsmLayerConfig second = c.ssm_layers[0];
  second.id = 10;
  second.reuse_policy = ReusePolicy::kOptional;  // replay_row keeps its own PRIVATE override
  c.ssm_layers.push_back(second);
  const StoragePlan plan = build_ok(c);
  ASSERT_EQ(plan.cache_groups().size(), 6u);
  EXPECT_EQ(plan.cache_groups()[1].policy, ReusePolicy::kOptional);
  EXPECT_EQ(plan.buffer_group_id(10, "ssm_state")->value, 1u);
  EXPECT_EQ(plan.buffer_group_id(10, "replay_row")->value, 2u);
  EXPECT_EQ(plan.buffer_group_id(0, "replay_row")->value, 2u);
  EXPECT_EQ(plan.cache_groups()[2].layers, (std::vector<LayerId>{0, 10}));
}

// --- Layout ---

TEST(Layout, PoolsCoalesceEqualSizesAndPoolGroupsShareIdenticalSlots) {
  const StoragePlan plan = build_ok(example_config());
  const auto& g = plan.cache_groups();
  EXPECT_EQ(g[0].slot_sizes, (std::vector<uint64_t>{4096, 1024}));
  EXPECT_EQ(g[1].slot_sizes, (std::vector<uint64_t>{16}));
  EXPECT_EQ(g[2].slot_sizes, (std::vector<uint64_t>{4096}));  // key + value of 2048
  EXPECT_EQ(g[3].slot_sizes, (std::vector<uint64_t>{2048}));
  EXPECT_EQ(g[4].slot_sizes, (std::vector<uint64_t>{2048}));
  const auto& pg = plan.pool_groups();
  ASSERT_EQ(pg.size(), 4u);
  EXPECT_EQ(pg[0].groups, std::vector<CacheGroupId>{CacheGroupId(0)});
  EXPECT_EQ(pg[1].groups, std::vector<CacheGroupId>{CacheGroupId(1)});
  EXPECT_EQ(pg[2].groups, std::vector<CacheGroupId>{CacheGroupId(2)});
  EXPECT_EQ(pg[3].groups, (std::vector<CacheGroupId>{CacheGroupId(3), CacheGroupId(4)}));
  EXPECT_EQ(pg[0].slot_bytes, 5120u);
  EXPECT_EQ(pg[1].slot_bytes, 16u);
  EXPECT_EQ(pg[2].slot_bytes, 4096u);
  EXPECT_EQ(pg[3].slot_bytes, 2048u);
}

TEST(Layout, EveryBufferHasGroupPoolOffsetAndSize) {
  const StoragePlan plan = build_ok(example_config());
  struct Expected {
    LayerId layer;
    const char* role;
    uint32_t group, pool_group, pool;
    uint64_t offset, size;
  };
  const Expected expected[] = {
      {0, "ssm_state", 0, 0, 0, 0, 4096}, {0, "conv_state", 0, 0, 1, 0, 1024},
      {0, "replay_row", 1, 1, 0, 0, 16},  {1, "key", 2, 2, 0, 0, 2048},
      {1, "value", 2, 2, 0, 2048, 2048},  {2, "key", 3, 3, 0, 0, 1024},
      {2, "value", 3, 3, 0, 1024, 1024},  {3, "key", 4, 3, 0, 0, 1024},
      {3, "value", 4, 3, 0, 1024, 1024},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(std::to_string(e.layer) + "/" + e.role);
    Result<const PlannedBuffer*> b = plan.find_buffer(e.layer, e.role);
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ((*b)->group.value, e.group);
    EXPECT_EQ((*b)->pool_group.value, e.pool_group);
    EXPECT_EQ((*b)->pool, e.pool);
    EXPECT_EQ((*b)->offset, e.offset);
    EXPECT_EQ((*b)->size, e.size);
  }
}

TEST(Layout, BuffersOfOneSizeAcrossLayersShareAPool) {
  ManagerConfig c = example_config();
  AttentionLayerConfig second = c.attention_layers[0];
  second.id = 5;
  c.attention_layers.push_back(second);
  const StoragePlan plan = build_ok(c);
  const CacheGroup& full = plan.cache_group(CacheGroupId(2));
  EXPECT_EQ(full.slot_sizes, (std::vector<uint64_t>{8192}));
  EXPECT_EQ((*plan.find_buffer(5, "key"))->offset, 4096u);
  EXPECT_EQ((*plan.find_buffer(5, "value"))->offset, 6144u);
}

// --- Addressing ---

TEST(Addressing, SharedAndPerLayerConvertersGiveHandComputedIndices) {
  const StoragePlan plan = build_ok(example_config());
  const std::vector<int32_t> slots = {0, 3, kBadPageIndex, 5};
  std::vector<int32_t> out(slots.size());
  ASSERT_TRUE(plan.convert_page_indices(1, "value", IndexMode::kShared, slots, out).is_ok());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 6, kBadPageIndex, 10}));  // scale 4096 / 2048 = 2
  ASSERT_TRUE(plan.convert_page_indices(1, "value", IndexMode::kPerLayer, slots, out).is_ok());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 7, kBadPageIndex, 11}));  // + offset 2048 / 2048
  ASSERT_TRUE(plan.convert_page_indices(1, "key", IndexMode::kPerLayer, slots, out).is_ok());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 6, kBadPageIndex, 10}));
  ASSERT_TRUE(plan.convert_page_indices(0, "conv_state", IndexMode::kShared, slots, out).is_ok());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 3, kBadPageIndex, 5}));  // own pool, scale 1

  const BufferAddress shared = *plan.buffer_address(1, "value", IndexMode::kShared);
  EXPECT_EQ(shared.base_offset, 2048u);
  EXPECT_EQ(shared.stride, 2048u);
  EXPECT_EQ(shared.scale, 2);
  const BufferAddress per_layer = *plan.buffer_address(1, "value", IndexMode::kPerLayer);
  EXPECT_EQ(per_layer.base_offset, 0u);
  EXPECT_EQ(per_layer.index_offset, 1);
  // Both modes address the same byte of the pool: base + index * stride.
  for (int64_t slot : {0, 1, 7}) {
    EXPECT_EQ(shared.base_offset + shared.page_index(slot) * shared.stride,
              per_layer.base_offset + per_layer.page_index(slot) * per_layer.stride);
  }
}

TEST(Addressing, ConverterRejectsBadInputAndUnknownBuffers) {
  const StoragePlan plan = build_ok(example_config());
  std::vector<int32_t> slots = {1, -2};
  std::vector<int32_t> out(2, 99);
  EXPECT_FALSE(plan.convert_page_indices(1, "key", IndexMode::kShared, slots, out).is_ok());
  std::vector<int32_t> short_out(1);
  EXPECT_FALSE(plan.convert_page_indices(1, "key", IndexMode::kShared, slots, short_out).is_ok());
  EXPECT_EQ(plan.convert_page_indices(4, "key", IndexMode::kShared, slots, out).code(),
            StatusCode::kNotFound);
}

TEST(Addressing, PageIndexUpperBoundIsSlotsTimesScale) {
  const StoragePlan plan = build_ok(example_config());
  const uint64_t full_slots = plan.slots(TierKind::kGpu, PoolGroupId(2));
  EXPECT_EQ(*plan.page_index_upper_bound(1, "key", TierKind::kGpu),
            static_cast<int64_t>(full_slots * 2));
  const uint64_t window_slots = plan.slots(TierKind::kGpu, PoolGroupId(3));
  EXPECT_EQ(*plan.page_index_upper_bound(3, "value", TierKind::kGpu),
            static_cast<int64_t>(window_slots * 2));
  EXPECT_EQ(*plan.page_index_upper_bound(3, "value", TierKind::kHost), 0);  // no host tier
}

// --- Slot counts ---

TEST(Slots, FloorsAreOneRequestWorstCaseScaledByUtil) {
  const StoragePlan plan = build_ok(example_config());
  const auto& g = plan.cache_groups();
  EXPECT_EQ(g[0].one_request_slots, 1u);
  EXPECT_EQ(g[2].one_request_slots, 1u);
  EXPECT_EQ(g[3].one_request_slots, 3u);  // 32 tokens touch at most ceil(31 / 16) + 1 blocks
  EXPECT_EQ(g[4].one_request_slots, 4u);  // + 1 sink block
  const auto& pg = plan.pool_groups();
  EXPECT_EQ(pg[0].floor_slots, 2u);  // ceil(1 / 0.95)
  EXPECT_EQ(pg[2].floor_slots, 2u);
  EXPECT_EQ(pg[3].floor_slots, 8u);  // ceil(7 / 0.95) = ceil(7.37)
}

TEST(Slots, WindowShorterThanABlockStillNeedsTwoSlots) {
  ManagerConfig c = example_config();
  c.attention_layers[1].window = 5;  // 5 tokens (ceil(4 / 16) + 1) can straddle two blocks
  const StoragePlan plan = build_ok(c);
  EXPECT_EQ(plan.cache_group(*plan.buffer_group_id(2, "key")).one_request_slots, 2u);
}

TEST(Slots, DefaultBatchRatioSplitsTheQuota) {
  // Default batch: 32 requests of 2048 tokens decoding; weights are slot demand x slot bytes.
  // A window of 32 at history 2047 reads tokens 2016..2047: blocks 126 and 127, 2 per request
  // (3 with the sink block), so windows weigh 32 x (2 + 3) against full attention's 32 x 128.
  // The shares round down to 3, 3, 497 and 19 slots (5,120, 16, 4,096 and 2,048 B), using
  // 2,090,032 of 2,097,152 B; the 7,120 B left go to pg 0 (furthest below its share: one
  // 5,120 B slot), then the last 2,000 B to pg 1 (125 slots of 16 B): nothing is stranded.
  const StoragePlan plan = build_ok(example_config());
  EXPECT_EQ(gpu_slots(plan), (std::vector<uint64_t>{4, 128, 497, 19}));
  EXPECT_EQ(plan.tier(TierKind::kGpu)->unassigned_bytes, 0u);
  EXPECT_EQ(plan.tier(TierKind::kGpu)->quota, 2u << 20);
  EXPECT_FALSE(plan.tier(TierKind::kGpu)->quota_raised);
}

TEST(Slots, TypicalStepShapesTheRatio) {
  ManagerConfig c = example_config();
  c.typical_step = BatchShape{std::vector<RequestShape>(4, {64, 63}), {}};
  // Windows read tokens 32..63 (blocks 2, 3) and the sink block: 2 + 3 against 4 full blocks.
  // Rounded down: 66, 66, 264, 330 slots use 2,096,160 B; the 992 B left fit only pg 1's 16 B
  // slots: 62 more.
  EXPECT_EQ(gpu_slots(build_ok(c)), (std::vector<uint64_t>{66, 128, 264, 330}));
}

TEST(Slots, ExplicitRatioWithFixedPrivatePool) {
  ManagerConfig c = example_config();
  c.max_live_kv_caches = 19;  // ceil(19 / 0.95) = 20 exactly, not 21
  c.pool_ratio = std::vector<double>{1, 1, 1, 1};
  const StoragePlan plan = build_ok(c);
  EXPECT_TRUE(plan.pool_groups()[1].fixed_private);
  EXPECT_EQ(plan.pool_groups()[1].floor_slots, 20u);
  // The fixed pool (20 x 16 B) comes out first; the rest splits 1:1:1 by bytes: 136, 170 and
  // 341 slots leave 5,824 B, of which pg 0 takes a 5,120 B slot; the fixed pool takes none, and
  // 704 B (under pg 3's 2,048 B slot) stay unassigned.
  EXPECT_EQ(gpu_slots(plan), (std::vector<uint64_t>{137, 20, 170, 341}));
  EXPECT_EQ(plan.tier(TierKind::kGpu)->unassigned_bytes, 704u);
}

TEST(Slots, FixedPrivatePoolIsAPoolGroupOfItsOwn) {
  ManagerConfig c = example_config();
  // Make the PRIVATE replay row the same size as a window slot, so slot lists would match.
  c.ssm_layers[0].buffers[2].bytes_per_page = 2048;
  StoragePlan plan = build_ok(c);
  EXPECT_EQ(plan.pool_groups().size(), 3u);  // PRIVATE SSM shares with the window groups
  c.max_live_kv_caches = 8;
  plan = build_ok(c);
  ASSERT_EQ(plan.pool_groups().size(), 4u);
  EXPECT_TRUE(plan.pool_group(plan.cache_group(CacheGroupId(1)).pool_group).fixed_private);
}

TEST(Slots, ConstraintsOverrideAnInfeasibleExplicitRatio) {
  ManagerConfig c = example_config();
  c.max_live_kv_caches = 19;
  c.pool_ratio = std::vector<double>{1, 1, 1, 1e-6};
  c.constraints.push_back(BatchShape{std::vector<RequestShape>(10, {160, 0}), {}});
  const StoragePlan plan = build_ok(c);
  // Constraint floors: pg0 ceil(10 / .95) = 11; pg2 ceil(100 / .95) = 106;
  // pg3 ceil((10 + 10) * 10 / .95) = 211.
  EXPECT_EQ(plan.pool_groups()[0].floor_slots, 11u);
  EXPECT_EQ(plan.pool_groups()[2].floor_slots, 106u);
  EXPECT_EQ(plan.pool_groups()[3].floor_slots, 211u);
  // 162, 203 and 211 slots leave 3,776 B: pg 3 (2,048 B) takes one more, 1,728 B remain.
  EXPECT_EQ(gpu_slots(plan), (std::vector<uint64_t>{162, 20, 203, 212}));
  ASSERT_EQ(plan.notes().size(), 1u);
  EXPECT_NE(plan.notes()[0].find("pool group 3: pool_ratio gives"), std::string::npos);
}

TEST(Slots, NoPoolGroupIsLeftASlotShortWhileBytesAreUnassigned) {
  // Every quota from 2 to 64 MiB, with and without a fixed PRIVATE pool, on GPU and host: what
  // stays unassigned is under one slot of every pool group the ratio splits.
  for (const bool fixed : {false, true}) {
    for (uint64_t mib = 2; mib <= 64; mib += 3) {
      ManagerConfig c = example_config();
      if (fixed) c.max_live_kv_caches = 7;
      c.tiers[0].quota_bytes = mib << 20;
      c.tiers.push_back({TierKind::kHost, (mib << 20) + 12345, ""});
      const StoragePlan plan = build_ok(c);
      for (const TierPlan& t : plan.tiers()) {
        SCOPED_TRACE(std::string(tier_kind_name(t.kind)) + " " + std::to_string(mib) + " MiB");
        EXPECT_EQ(t.bytes_used + t.unassigned_bytes, t.quota);
        for (const PoolGroup& pg : plan.pool_groups()) {
          if (!pg.fixed_private) {
            EXPECT_LT(t.unassigned_bytes, pg.slot_bytes) << pg.id.value;
          }
        }
      }
    }
  }
}

TEST(Slots, StateOnlyRequestsOfCapacityZeroReserveOnlyStateSlots) {
  ManagerConfig c = example_config();
  c.constraints.push_back(BatchShape{std::vector<RequestShape>(10, {0, 0}), {}});
  const StoragePlan plan = build_ok(c);
  // Ten requests with a state and no KV: each SSM group ceil(10 / .95) = 11 slots; the attention
  // floors stay at one request's worst case, ceil(1 / .95) = 2 and ceil(7 / .95) = 8.
  EXPECT_EQ(plan.pool_groups()[0].floor_slots, 11u);
  EXPECT_EQ(plan.pool_groups()[1].floor_slots, 11u);
  EXPECT_EQ(plan.pool_groups()[2].floor_slots, 2u);
  EXPECT_EQ(plan.pool_groups()[3].floor_slots, 8u);
}

TEST(Slots, SharedSystemPromptBlocksAreCountedOnce) {
  ManagerConfig c = example_config();
  c.constraints.push_back(BatchShape{std::vector<RequestShape>(4, {160, 159}), 64});
  const StoragePlan plan = build_ok(c);
  // Full attention: 4 shared blocks once + 6 own blocks x 4 = 28 -> ceil(28 / .95) = 30.
  EXPECT_EQ(plan.pool_groups()[2].floor_slots, 30u);
  // Windows: first live token 159 + 1 - 32 = 128 -> blocks 8..9 (2 each, none shared) -> 8;
  // sinks: block 0 is shared, once -> 8 + 1 + 8 = 17 -> ceil(17 / .95) = 18.
  EXPECT_EQ(plan.pool_groups()[3].floor_slots, 18u);
}

TEST(Slots, LiveFloorHoldsSsmPoolsWhenBlockReuseIsOff) {
  ManagerConfig c = example_config();
  c.enable_block_reuse = false;
  c.typical_step = BatchShape{std::vector<RequestShape>(4, {64, 63}), {}};
  const StoragePlan plan = build_ok(c);
  EXPECT_TRUE(plan.pool_groups()[0].live_floor);
  EXPECT_TRUE(plan.pool_groups()[1].live_floor);
  EXPECT_FALSE(plan.pool_groups()[2].live_floor);
  // ceil(4 / 0.95) = 5 states each; attention takes the rest.
  EXPECT_EQ(gpu_slots(plan), (std::vector<uint64_t>{5, 5, 311, 389}));
}

TEST(Slots, QuotaTooSmallIsRaisedToTheMinimumAndThePlanSaysSo) {
  ManagerConfig c = example_config();
  c.max_live_kv_caches = 19;
  c.ssm_layers[0].buffers[0].bytes_per_page = 1u << 20;
  c.tiers[0].quota_bytes = 1;
  const StoragePlan plan = build_ok(c);
  const TierPlan& gpu = *plan.tier(TierKind::kGpu);
  EXPECT_TRUE(gpu.quota_raised);
  EXPECT_EQ(gpu.requested_quota, 1u);
  // Floors: 2 x (1 MiB + 1024) + 20 x 16 + 2 x 4096 + 8 x 2048 = 2,124,096 B -> two 2 MiB grains.
  EXPECT_EQ(gpu.quota, 4u << 20);
  EXPECT_EQ(*minimum_gpu_quota(c), 4u << 20);
  EXPECT_EQ(gpu.slots[1], 20u);
  ASSERT_FALSE(plan.notes().empty());
  EXPECT_EQ(plan.notes()[0],
            "GPU quota raised from 1 B to 4.00 MiB: the pool-group floors need 2.03 MiB");
}

TEST(Slots, QuotaIsRoundedUpToTheGrainWithoutARaise) {
  ManagerConfig c = example_config();
  c.tiers[0].quota_bytes = 1;  // the 35 KiB of floors fit in one 2 MiB grain
  const StoragePlan plan = build_ok(c);
  EXPECT_FALSE(plan.tier(TierKind::kGpu)->quota_raised);
  EXPECT_EQ(plan.tier(TierKind::kGpu)->quota, 2u << 20);
  EXPECT_TRUE(plan.notes().empty());
}

TEST(Slots, LargeFloorsRaiseToWholeGrains) {
  ManagerConfig c = example_config();
  c.ssm_layers[0].buffers[0].bytes_per_page = 100ull << 20;  // a 100 MiB state
  c.constraints.push_back(BatchShape{std::vector<RequestShape>(30, {16, 0}), {}});
  const StoragePlan plan = build_ok(c);
  const TierPlan& gpu = *plan.tier(TierKind::kGpu);
  EXPECT_TRUE(gpu.quota_raised);
  // pg0 floor ceil(30 / .95) = 32 slots of 100 MiB + 1 KiB: 3.1 GiB -> 4 MiB grains.
  EXPECT_EQ(gpu.grain, 4u << 20);
  EXPECT_EQ(gpu.quota % gpu.grain, 0u);
  EXPECT_GE(gpu.slots[0], 32u);
}

TEST(Slots, ColderTiersSplitByRatioWithoutFloors) {
  ManagerConfig c = example_config();
  c.pool_ratio = std::vector<double>{1, 1, 1, 1};
  c.tiers.push_back({TierKind::kHost, 3 * 4096 * 100, ""});
  const StoragePlan plan = build_ok(c);
  const TierPlan& host = *plan.tier(TierKind::kHost);
  EXPECT_EQ(host.grain, 4096u);
  // 1,228,800 B / 4 = 307,200 each: 60, 19200, 75, 150 slots.
  EXPECT_EQ(host.slots, (std::vector<uint64_t>{60, 19200, 75, 150}));
}

TEST(Slots, GrainGrowsWithTheGpuQuota) {
  EXPECT_EQ(tier_grain(TierKind::kGpu, 64ull << 20), 2ull << 20);
  EXPECT_EQ(tier_grain(TierKind::kGpu, 1ull << 30), 2ull << 20);
  EXPECT_EQ(tier_grain(TierKind::kGpu, 4ull << 30), 8ull << 20);
  EXPECT_EQ(tier_grain(TierKind::kGpu, 16ull << 30), 32ull << 20);
  EXPECT_EQ(tier_grain(TierKind::kGpu, 80ull << 30), 32ull << 20);
  EXPECT_EQ(tier_grain(TierKind::kHost, 80ull << 30), 4096u);
  EXPECT_EQ(tier_grain(TierKind::kDisk, 80ull << 30), 2ull << 20);
}

}  // namespace
// Issue 36: slot indices are int32 in block tables; a quota that gives a pool group more slots
// than that is refused with the tier, the quota and the count, never wrapped.
TEST(TierPlan, MoreSlotsThanInt32IndicesHoldAreRefused) {
  ManagerConfig c;
  c.tokens_per_block = 16;
  AttentionLayerConfig a;
  a.buffers = {{"key", 512, {}, {}}, {"value", 512, {}, {}}};
  c.attention_layers.push_back(a);
  c.tiers = {{TierKind::kGpu, 1ull << 30, ""}, {TierKind::kHost, 1ull << 44, ""}};
  const Result<StoragePlan> plan = StoragePlan::build(c);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("tiers[1] (HOST): quota 16.00 TiB gives pool group 0 "
                                         "17179869184 slots"),
            std::string::npos)
      << plan.status().to_string();
  c.tiers[1].quota_bytes = 1ull << 40;  // 2^30 slots
  EXPECT_TRUE(StoragePlan::build(c).is_ok());
}

}  // namespace hybridkv
