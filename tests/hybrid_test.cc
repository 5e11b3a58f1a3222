// The hybrid layer: replay buffers per family, pipeline ranks, sizing, per-step indices and
// resets, exact suspend/resume with slot theft, re-prefill, free, dummies and NaN/Inf
// diagnostics (snapshot placement: snapshot_policy_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "bundled_models.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/testing/inspect.h"
#include "hybridkv/units.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

ModelDescription model(const std::string& file, uint32_t tp = 1) {
  return testing::bundled_model(file, tp);
}

ServingConfig serving64(uint32_t spec, ReplayLayout layout = ReplayLayout::kPrivate) {
  ServingConfig s;
  s.max_batch = 64;
  s.num_spec_tokens = spec;
  s.replay_layout = layout;
  return s;
}

// --- Plans, checked by hand ---

TEST(HybridPlan, NemotronHPrivateReplayByHand) {
  const ManagerConfig c = *hybrid_manager_config(model("nemotron_h_8b.json"), serving64(3));
  EXPECT_EQ(*c.max_live_kv_caches, 65u);  // 64 x 1 x 1 + 0 + 1
  const StoragePlan plan = *StoragePlan::build(c);
  const CacheGroupId replay = *plan.buffer_group_id(0, "replay_old_x");
  EXPECT_EQ(plan.cache_group(replay).policy, ReusePolicy::kPrivate);
  // Per layer: old_x 2*3*128*64*2 = 98,304; old_B 2*3*8*128*2 = 12,288; old_dt and
  // old_dA_cumsum 2*3*128*4 = 3,072 each; 24 layers, plus one 16-byte meta row.
  EXPECT_EQ((*plan.find_buffer(0, "replay_old_x"))->size, 98304u);
  EXPECT_EQ((*plan.find_buffer(0, "replay_old_B"))->size, 12288u);
  EXPECT_EQ((*plan.find_buffer(0, "replay_old_dt"))->size, 3072u);
  EXPECT_EQ((*plan.find_buffer(0, "replay_old_dA_cumsum"))->size, 3072u);
  EXPECT_EQ((*plan.find_buffer(0, "replay_meta"))->size, 16u);
  const PoolGroup& pg = plan.pool_group(plan.cache_group(replay).pool_group);
  EXPECT_EQ(pg.slot_bytes, 24u * (98304 + 12288 + 3072 + 3072) + 16);
  EXPECT_TRUE(pg.fixed_private);
  EXPECT_EQ(plan.slots(TierKind::kGpu, pg.id), 68u);  // ceil(65 / 0.97)
  // The state group is untouched by replay.
  const CacheGroupId state = *plan.buffer_group_id(0, "ssm_state");
  EXPECT_EQ(plan.pool_group(plan.cache_group(state).pool_group).slot_bytes, 102137856u);
}

TEST(HybridPlan, QwenNextRingReplayIsCoupledToTheStateSlot) {
  const ManagerConfig c =
      *hybrid_manager_config(model("qwen3_next_80b_a3b.json"), serving64(3, ReplayLayout::kRing));
  const StoragePlan plan = *StoragePlan::build(c);
  const CacheGroupId state = *plan.buffer_group_id(0, "ssm_state");
  EXPECT_EQ(*plan.buffer_group_id(0, "replay_k_ring"), state);
  for (const CacheGroup& g : plan.cache_groups()) EXPECT_NE(g.policy, ReusePolicy::kPrivate);
  // Per layer: state 32*128*128*4 = 2,097,152; conv (2*16*128 + 32*128)*3*2 = 49,152;
  // k_ring 3*16*128*2 = 12,288; u_ring 3*32*128*2 = 24,576; g_ring 3*32*4 = 384; 36 layers + 16.
  EXPECT_EQ(plan.pool_group(plan.cache_group(state).pool_group).slot_bytes,
            36u * (2097152 + 49152 + 12288 + 24576 + 384) + 16);
  // The Triton layout instead: PRIVATE old_x 2*3*32*128*2, old_B 2*3*16*128*2, old_dt 2*3*32*4.
  const StoragePlan triton =
      *StoragePlan::build(*hybrid_manager_config(model("qwen3_next_80b_a3b.json"), serving64(3)));
  const CacheGroupId replay = *triton.buffer_group_id(0, "replay_old_x");
  EXPECT_EQ(triton.pool_group(triton.cache_group(replay).pool_group).slot_bytes,
            36u * (49152 + 24576 + 768) + 16);
}

TEST(HybridPlan, KdaRecordsAndRingOnlyForGdn) {
  const StoragePlan plan =
      *StoragePlan::build(*hybrid_manager_config(model("kimi_linear_48b_a3b.json"), serving64(3)));
  // records 3 * 3 * 32 * 128 * 4; conv windows (3*32*128) * 3 * 2.
  EXPECT_EQ((*plan.find_buffer(0, "replay_records"))->size, 3u * 3 * 32 * 128 * 4);
  EXPECT_EQ((*plan.find_buffer(0, "replay_conv"))->size, 3u * 32 * 128 * 3 * 2);
  Result<ManagerConfig> ring =
      hybrid_manager_config(model("kimi_linear_48b_a3b.json"), serving64(3, ReplayLayout::kRing));
  ASSERT_FALSE(ring.is_ok());
  EXPECT_NE(ring.status().message().find("replay_layout ring is only for GDN models"),
            std::string::npos);
}

TEST(HybridPlan, ContextServersDeclareNoReplay) {
  ServingConfig s = serving64(3);
  s.role = DisaggRole::kContext;
  const ManagerConfig c = *hybrid_manager_config(model("nemotron_h_8b.json"), s);
  for (const SsmLayerConfig& l : c.ssm_layers) EXPECT_EQ(l.buffers.size(), 2u);
  EXPECT_EQ(*c.max_live_kv_caches, 129u);  // disaggregation doubles: 64 * 2 + 1
}

TEST(HybridPlan, LiveCachesFormula) {
  ServingConfig s;
  s.max_batch = 64;
  s.pp_size = 2;
  s.overlap_scheduling = true;
  s.dummy_slots = 3;
  EXPECT_EQ(max_live_caches(s), 64u * 2 * 2 + 3 + 1);
}

TEST(HybridPlan, PipelineRanksShareLayersAndMtpGoesLast) {
  const ModelDescription m = model("nemotron_h_8b.json");
  ServingConfig s = serving64(0);
  s.pp_size = 2;
  s.mtp_layers = 1;
  s.pp_rank = 0;
  const ManagerConfig r0 = *hybrid_manager_config(m, s);
  s.pp_rank = 1;
  const ManagerConfig r1 = *hybrid_manager_config(m, s);
  // Model layers 0..25 and 26..51: attention at 7, 18 | 29, 40, plus the MTP layer on rank 1.
  EXPECT_EQ(r0.attention_layers.size(), 2u);
  EXPECT_EQ(r1.attention_layers.size(), 3u);
  EXPECT_EQ(r0.ssm_layers.size() + r1.ssm_layers.size(), 24u);
  // A rank with only attention, and one with only recurrent layers, both work.
  ServingConfig j = serving64(0);
  j.pp_size = 32;
  j.pp_rank = 4;  // Jamba: model layer 4 is attention
  // 64 x 32 = 2,048 ACTIVE requests need ceil(2,048 / 0.97) = 2,112 states of 573,440 B on the
  // recurrent rank (1.13 GiB): 2 GiB.
  j.tiers = {{TierKind::kGpu, 2ull << 30, ""}};
  const ManagerConfig only_attention = *hybrid_manager_config(model("jamba_v0_1.json"), j);
  EXPECT_EQ(only_attention.attention_layers.size(), 1u);
  EXPECT_TRUE(only_attention.ssm_layers.empty());
  const BackendOptions none{BackendKind::kNone};
  EXPECT_TRUE(HybridCacheManager::create(model("jamba_v0_1.json"), j, none).is_ok());
  j.pp_rank = 5;
  const ManagerConfig only_ssm = *hybrid_manager_config(model("jamba_v0_1.json"), j);
  EXPECT_TRUE(only_ssm.attention_layers.empty());
  EXPECT_EQ(only_ssm.ssm_layers.size(), 1u);
  Result<std::unique_ptr<HybridCacheManager>> h =
      HybridCacheManager::create(model("jamba_v0_1.json"), j, none);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_TRUE((*h)->state_group().has_value());
}

TEST(HybridPlan, BadServingSettingsNameTheField) {
  const ModelDescription m = model("nemotron_h_8b.json");
  ServingConfig s = serving64(3);
  s.pp_size = 2;
  s.pp_rank = 2;
  EXPECT_NE(hybrid_manager_config(m, s).status().message().find("pp_rank 2 must be < pp_size 2"),
            std::string::npos);
  s = serving64(3);
  s.max_batch = 0;
  EXPECT_NE(hybrid_manager_config(m, s).status().message().find("max_batch 0 must be > 0"),
            std::string::npos);
}

TEST(HybridPlan, ConfigurationsThatCannotHoldTheirFloorsAreRefused) {
  ServingConfig s = serving64(3);
  s.tiers = {{TierKind::kGpu, 64ull << 20, ""}};
  Result<std::unique_ptr<HybridCacheManager>> h =
      HybridCacheManager::create(model("nemotron_h_8b.json"), s, {BackendKind::kNone});
  ASSERT_FALSE(h.is_ok());
  EXPECT_NE(h.status().message().find("raise the GPU quota to at least"), std::string::npos)
      << h.status().message();
  EXPECT_NE(h.status().message().find("or lower max_batch"), std::string::npos);
}

TEST(HybridPlan, EveryRequestOfAFullBatchHasAStateSlot) {
  // Nemotron-H 8B, max_batch 64, pp 1, 2 dummies: 66 ACTIVE requests need a state each, so the
  // state pool's floor is ceil(66 / 0.97) = ceil(68.04) = 69 slots at any accepted quota.
  ServingConfig s = serving64(0);
  s.dummy_slots = 2;
  const ManagerConfig c = *hybrid_manager_config(model("nemotron_h_8b.json"), s);
  const uint64_t minimum = *minimum_gpu_quota(c);
  const StoragePlan plan = *StoragePlan::build(c);
  const CacheGroupId state = *plan.buffer_group_id(0, "ssm_state");
  EXPECT_EQ(plan.pool_group(plan.cache_group(state).pool_group).floor_slots, 69u);
  // At the minimum quota all 64 requests (and the dummies) are ACTIVE together.
  s.tiers = {{TierKind::kGpu, minimum, ""}};
  auto h =
      std::move(HybridCacheManager::create(model("nemotron_h_8b.json"), s, {BackendKind::kNone}))
          .value();
  EXPECT_GE(h->plan().slots(TierKind::kGpu, plan.cache_group(state).pool_group), 69u);
  const std::vector<int32_t> prompt(100, 7);
  for (uint64_t r = 0; r < 64; ++r) {
    ASSERT_TRUE(h->add_request(r, prompt).is_ok());
    const Status resumed = h->resume(r);
    ASSERT_TRUE(resumed.is_ok()) << "request " << r << ": " << resumed.to_string();
  }
  EXPECT_EQ(h->manager().storage_stats().active_caches, 66u);
  // One grain less is refused, naming the minimum.
  s.tiers = {{TierKind::kGpu, minimum - tier_grain(TierKind::kGpu, minimum), ""}};
  Result<std::unique_ptr<HybridCacheManager>> small =
      HybridCacheManager::create(model("nemotron_h_8b.json"), s, {BackendKind::kNone});
  ASSERT_FALSE(small.is_ok());
  EXPECT_NE(small.status().message().find("at least " + format_bytes(minimum)), std::string::npos)
      << small.status().message();
  EXPECT_NE(small.status().message().find("66 ACTIVE requests"), std::string::npos);
}

// A prompt handed over (add_request(id, std::vector&&)) becomes the cache's own tokens; a
// refused one (an id taken, keys of another prompt) is left with the caller, whole.
TEST(HybridRequests, AMovedPromptIsTheCachesAndARefusalLeavesItWhole) {
  ServingConfig s = serving64(0);
  s.tiers = {{TierKind::kGpu, 16ull << 30, ""}};
  auto h =
      std::move(HybridCacheManager::create(model("nemotron_h_8b.json"), s, {BackendKind::kNone}))
          .value();
  std::vector<int32_t> prompt(1000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 + 1);
  const std::vector<int32_t> copy = prompt;
  std::vector<int32_t> moved = prompt;
  ASSERT_TRUE(h->add_request(1, std::move(moved)).is_ok());
  EXPECT_EQ(h->cache(1)->reuse_match().lookup_tokens, copy.size() - 1);  // less the last token
  std::vector<int32_t> again = prompt;
  const Status taken = h->add_request(1, std::move(again));
  EXPECT_EQ(taken.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(again, copy);
  std::vector<int32_t> other = prompt;
  other[500] += 1;
  std::vector<int32_t> handed = other;
  const Status wrong =
      h->add_request(2, std::move(handed), {}, h->manager().hash_prompt({}, prompt));
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument) << wrong.to_string();
  EXPECT_EQ(handed, other);
  EXPECT_EQ(h->cache(2), nullptr);
  // What the moved prompt's request commits, the same prompt by span reuses.
  ASSERT_TRUE(h->resume(1).is_ok());
  ASSERT_TRUE(h->resize(1, copy.size(), copy.size()).is_ok());
  ASSERT_TRUE(h->commit_at_snapshot(1).is_ok());
  ASSERT_TRUE(h->free_request(1).is_ok());
  std::vector<int32_t> next = copy;
  next.resize(copy.size() + 50, 3);
  ASSERT_TRUE(h->add_request(3, std::span<const int32_t>(next)).is_ok());
  EXPECT_EQ(h->cache(3)->reuse_match().reused_tokens, copy.size());
}

// --- Lifecycle per family, through the fake engine on the host backend ---

struct Family {
  const char* file;
  ReplayLayout layout;
  uint32_t tp;
};

class HybridFamily : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    const Family f = GetParam();
    model_ = model(f.file, f.tp);
    serving_.max_batch = 1;
    serving_.num_spec_tokens = 3;
    serving_.replay_layout = f.layout;
    serving_.tokens_per_block = 16;
    serving_.dummy_slots = 2;
    ManagerConfig c = *hybrid_manager_config(model_, serving_);
    // A GPU that holds one request at a time (floors only), so that others take its slots.
    // Without a fixed PRIVATE pool the replay pages move under pressure too.
    c.max_live_kv_caches.reset();
    c.typical_step.reset();
    // One request of 128 tokens and the two dummies (one block each) at a time.
    c.constraints = {BatchShape{{{128, 127}, {16, 0}, {16, 0}}, {}}};
    c.tiers = {{TierKind::kGpu, *minimum_gpu_quota(c), ""}};
    c.tiers.push_back({TierKind::kHost, 16 * c.tiers[0].quota_bytes, ""});
    Result<std::unique_ptr<HybridCacheManager>> h =
        HybridCacheManager::create(c, serving_, testing::test_backend());
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    hybrid_ = std::move(h).value();
    engine_ = std::make_unique<testing::FakeEngine>(hybrid_->manager());
  }

  // Adds, resumes and computes a request of `n` tokens; suspends it.
  void run_request(uint64_t id, uint64_t n, std::vector<int32_t>* slots_seen = nullptr) {
    std::vector<int32_t> tokens = testing::random_tokens(rng_, n);
    ASSERT_OK(hybrid_->add_request(id, tokens));
    ASSERT_OK(hybrid_->resume(id));
    fakes_[id].tokens = {tokens};
    ASSERT_OK(hybrid_->resize(id, n, 0));
    ASSERT_OK(engine_->step(*hybrid_->cache(id), fakes_[id], n));
    if (slots_seen)
      slots_seen->push_back(*hybrid_->cache(id)->state_index(*hybrid_->state_group()));
    ASSERT_OK(hybrid_->suspend(id));
  }

  // Resets expected per request: none for a family without replay (Mamba1).
  size_t resets(size_t per) const { return hybrid_->replay_group() ? per : 0; }

  ModelDescription model_;
  ServingConfig serving_;
  std::unique_ptr<HybridCacheManager> hybrid_;
  std::unique_ptr<testing::FakeEngine> engine_;
  std::map<uint64_t, testing::FakeRequest> fakes_;
  std::mt19937_64 rng_{5};
};

TEST_P(HybridFamily, SuspendedStateFollowsRequestIntoNewSlotBitForBit) {
  std::vector<int32_t> others;
  ASSERT_NO_FATAL_FAILURE(run_request(1, 100));
  ASSERT_OK(hybrid_->resume(1));
  const int32_t state_before = *hybrid_->cache(1)->state_index(*hybrid_->state_group());
  ASSERT_OK(hybrid_->suspend(1));
  // Others take the GPU slots, A's among them, and write their own bytes there.
  const uint64_t state_slots = hybrid_->plan().slots(
      TierKind::kGpu, hybrid_->plan().cache_group(*hybrid_->state_group()).pool_group);
  for (uint64_t i = 0; i < state_slots + 1; ++i)
    ASSERT_NO_FATAL_FAILURE(run_request(10 + i, 60, &others));
  EXPECT_NE(std::find(others.begin(), others.end(), state_before), others.end())
      << "another request took the suspended request's state slot";
  (void)hybrid_->manager().take_iteration_stats();
  ASSERT_OK(hybrid_->resume(1));
  EXPECT_GT(hybrid_->manager().take_iteration_stats().pages_onboarded, 0u);
  // State, conv and every replay byte are what the request itself wrote.
  engine_->set_sampled_check(0);
  ASSERT_OK(engine_->verify(*hybrid_->cache(1), fakes_[1]));
  // Suspend does not clear the replay reset mark: the first step resets the replay page once.
  const std::vector<uint64_t> ids = {1};
  Result<HybridCacheManager::Step> step = hybrid_->prepare_step(ids, 0);
  ASSERT_TRUE(step.is_ok());
  EXPECT_EQ(step->replay_resets.size(), resets(1));
  EXPECT_EQ(hybrid_->prepare_step(ids, 0)->replay_resets.size(), 0u);
  ASSERT_OK(hybrid_->suspend(1));
  ASSERT_OK(hybrid_->resume(1));
  EXPECT_EQ(hybrid_->prepare_step(ids, 0)->replay_resets.size(), 0u);  // suspend kept the mark
  EXPECT_EQ(testing::check_invariants(hybrid_->manager()), "");
}

// reset_replay zeroes exactly the replay buffers of the step's reset slots (a batched kernel on
// the CUDA backend); the state buffers sharing the slot keep their bytes.
TEST_P(HybridFamily, ResetReplayZeroesOnlyTheReplayBuffers) {
  ASSERT_NO_FATAL_FAILURE(run_request(1, 100));
  ASSERT_OK(hybrid_->resume(1));
  if (!hybrid_->replay_group()) GTEST_SKIP() << "no replay state in this family";
  const std::vector<uint64_t> ids = {1};
  Result<HybridCacheManager::Step> step = hybrid_->prepare_step(ids, 0);
  ASSERT_TRUE(step.is_ok());
  ASSERT_EQ(step->replay_resets.size(), 1u);
  const int32_t slot = step->replay_resets[0];
  KvCacheManager& m = hybrid_->manager();
  m.wait(hybrid_->cache(1)->ready_event());
  auto read = [&](const PlannedBuffer& b) {
    std::vector<std::byte> bytes(b.size);
    testing::read_pool_bytes(
        m, bytes.data(),
        m.slot_address(TierKind::kGpu, b.pool_group, b.pool, static_cast<uint32_t>(slot)) +
            b.offset,
        b.size);
    return bytes;
  };
  std::vector<std::pair<const PlannedBuffer*, std::vector<std::byte>>> kept;
  for (uint32_t bi : hybrid_->plan().cache_group(*hybrid_->replay_group()).buffers) {
    const PlannedBuffer& b = hybrid_->plan().buffers()[bi];
    if (b.role.rfind("replay_", 0) != 0) kept.emplace_back(&b, read(b));
  }
  hybrid_->reset_replay(*step);
  m.synchronize();
  int replay_buffers = 0;
  for (uint32_t bi : hybrid_->plan().cache_group(*hybrid_->replay_group()).buffers) {
    const PlannedBuffer& b = hybrid_->plan().buffers()[bi];
    if (b.role.rfind("replay_", 0) != 0) continue;
    ++replay_buffers;
    const std::vector<std::byte> bytes = read(b);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), std::byte{0}), static_cast<long>(b.size))
        << "layer " << b.layer << " " << b.role;
  }
  EXPECT_GT(replay_buffers, 0);
  for (const auto& [b, before] : kept) EXPECT_EQ(read(*b), before) << b->role;
}

TEST_P(HybridFamily, RePrefillStartsFromResetReplayState) {
  ASSERT_NO_FATAL_FAILURE(run_request(1, 100));
  ASSERT_OK(hybrid_->resume(1));
  const std::vector<uint64_t> ids = {1};
  EXPECT_EQ(hybrid_->prepare_step(ids, 0)->replay_resets.size(), resets(1));
  ASSERT_OK(hybrid_->suspend(1));
  ASSERT_OK(hybrid_->reprefill(1));             // comes back as a context request
  EXPECT_EQ(hybrid_->cache(1)->history(), 0u);  // nothing was committed: nothing reused
  ASSERT_OK(hybrid_->resume(1));
  Result<HybridCacheManager::Step> step = hybrid_->prepare_step(ids, 0);
  ASSERT_TRUE(step.is_ok());
  ASSERT_EQ(step->replay_resets.size(), resets(1));
  if (!step->replay_resets.empty()) {
    EXPECT_EQ(step->replay_resets[0], step->entries[0].replay_index);
  }
  fakes_[1].computed = 0;
  fakes_[1].state_written = false;
  ASSERT_OK(hybrid_->resize(1, 100, 0));
  ASSERT_OK(engine_->step(*hybrid_->cache(1), fakes_[1], 100));
  ASSERT_OK(engine_->verify(*hybrid_->cache(1), fakes_[1]));
}

TEST_P(HybridFamily, FreeingASuspendedRequestLeavesNothingBehind) {
  const StorageStats empty = hybrid_->manager().storage_stats();
  ASSERT_NO_FATAL_FAILURE(run_request(1, 100));
  ASSERT_NO_FATAL_FAILURE(run_request(2, 100));  // pushes 1 to the host
  ASSERT_OK(hybrid_->free_request(1));
  ASSERT_OK(hybrid_->free_request(2));
  EXPECT_EQ(hybrid_->free_request(2).code(), StatusCode::kNotFound);
  const StorageStats after = hybrid_->manager().storage_stats();
  for (size_t t = 0; t < after.tiers.size(); ++t) {
    for (size_t p = 0; p < after.tiers[t].pool_groups.size(); ++p) {
      EXPECT_EQ(after.tiers[t].pool_groups[p].free_slots, empty.tiers[t].pool_groups[p].free_slots);
    }
  }
  EXPECT_EQ(hybrid_->num_requests(), 0u);
}

TEST_P(HybridFamily, DummiesAreResetOnceKeepTheirSlotsAndAreNotCounted) {
  EXPECT_EQ(hybrid_->manager().take_iteration_stats().resumes, 0u);
  Result<HybridCacheManager::Step> first = hybrid_->prepare_step({}, 2);
  ASSERT_TRUE(first.is_ok());
  ASSERT_EQ(first->entries.size(), 2u);
  EXPECT_FALSE(first->entries[0].request_id.has_value());
  EXPECT_NE(first->entries[0].state_index, kBadPageIndex);
  EXPECT_NE(first->entries[0].state_index, first->entries[1].state_index);
  EXPECT_EQ(first->replay_resets.size(), resets(2));
  ASSERT_NO_FATAL_FAILURE(run_request(1, 50));
  Result<HybridCacheManager::Step> second = hybrid_->prepare_step({}, 2);
  EXPECT_TRUE(second->replay_resets.empty());
  EXPECT_EQ(second->entries[0].state_index, first->entries[0].state_index);
  EXPECT_EQ(second->entries[1].replay_index, first->entries[1].replay_index);
  EXPECT_FALSE(hybrid_->prepare_step({}, 3).is_ok());  // more dummies than slots
}

INSTANTIATE_TEST_SUITE_P(
    Families, HybridFamily,
    ::testing::Values(Family{"nemotron_h_8b.json", ReplayLayout::kPrivate, 8},
                      Family{"qwen3_next_80b_a3b.json", ReplayLayout::kPrivate, 8},
                      Family{"qwen3_next_80b_a3b.json", ReplayLayout::kRing, 8},
                      Family{"kimi_linear_48b_a3b.json", ReplayLayout::kPrivate, 8},
                      Family{"jamba_v0_1.json", ReplayLayout::kPrivate, 8}),
    [](const ::testing::TestParamInfo<Family>& info) {
      std::string name = info.param.file;
      name = name.substr(0, name.find('.'));
      return name + (info.param.layout == ReplayLayout::kRing ? "_ring" : "");
    });

// --- Diagnostics ---

TEST(HybridDiagnostics, NonFiniteValuesAreReportedWithLayerRoleAndSlot) {
  ServingConfig s;
  s.max_batch = 2;
  s.num_spec_tokens = 2;
  s.tokens_per_block = 16;
  s.tiers = {{TierKind::kGpu, 256ull << 20, ""}};
  auto h = std::move(HybridCacheManager::create(model("nemotron_h_8b.json", 8), s,
                                                testing::test_backend()))
               .value();
  std::vector<int32_t> prompt(40, 1);
  ASSERT_OK(h->add_request(7, prompt));
  ASSERT_OK(h->resume(7));
  ASSERT_OK(h->resize(7, 40, 0));
  // Clean pages first (fresh pages may hold anything: write zeros into them).
  const StoragePlan& plan = h->plan();
  KvCache& cache = *h->cache(7);
  for (const CacheGroup& g : plan.cache_groups()) {
    std::vector<int32_t> slots;
    if (g.kind == GroupKind::kSsm)
      slots.push_back(*cache.state_index(g.id));
    else {
      const auto t = cache.block_table(g.id);
      slots.assign(t->begin(), t->end());
    }
    for (uint32_t bi : g.buffers) {
      const PlannedBuffer& b = plan.buffers()[bi];
      for (int32_t slot : slots) {
        const std::span<std::byte> page(
            h->manager().slot_address(TierKind::kGpu, b.pool_group, b.pool, slot) + b.offset,
            b.size);
        h->manager().fill({&page, 1}, 0);
      }
    }
  }
  EXPECT_TRUE(h->scan_non_finite().empty());
  // A NaN in layer 2's ssm_state (fp32), element 5.
  const PlannedBuffer& ssm = **plan.find_buffer(2, "ssm_state");
  const int32_t slot = *cache.state_index(ssm.group);
  const float nan = std::nanf("");
  testing::write_pool_bytes(
      h->manager(),
      h->manager().slot_address(TierKind::kGpu, ssm.pool_group, ssm.pool, slot) + ssm.offset +
          5 * 4,
      &nan, 4);
  // An Inf in a bf16 key page of the first attention layer.
  const CacheGroupId attention = plan.cache_groups().back().id;
  const PlannedBuffer& key = plan.buffers()[plan.cache_group(attention).buffers[0]];
  const int32_t block0 = (*cache.block_table(attention))[0];
  const uint16_t inf_bf16 = 0x7f80;
  testing::write_pool_bytes(
      h->manager(),
      h->manager().slot_address(TierKind::kGpu, key.pool_group, key.pool, block0) + key.offset,
      &inf_bf16, 2);
  const std::vector<NonFiniteReport> reports = h->scan_non_finite(7);
  ASSERT_EQ(reports.size(), 2u);
  bool saw_ssm = false, saw_key = false;
  for (const NonFiniteReport& r : reports) {
    if (r.layer == 2 && r.role == "ssm_state") {
      saw_ssm = true;
      EXPECT_EQ(r.slot, static_cast<uint32_t>(slot));
      EXPECT_EQ(r.element, 5u);
    }
    if (r.layer == key.layer && r.role == key.role)
      saw_key = r.slot == static_cast<uint32_t>(block0);
    EXPECT_EQ(r.request_id, 7u);
  }
  EXPECT_TRUE(saw_ssm);
  EXPECT_TRUE(saw_key);
}

}  // namespace
}  // namespace hybridkv
