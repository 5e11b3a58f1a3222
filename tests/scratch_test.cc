// SWA scratch (issue 11 item 3): the converter's scratch mapping, the slots a long prompt saves,
// a small windowed model that computes the same tokens with scratch on and off (with an SSM
// layer in the same model), and the errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hybridkv/manager.h"
#include "hybridkv/model.h"
#include "hybridkv/testing/inspect.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

// Layers 1..3: window 6 (layer 3 keeps only a key, so the window pool has 5 buffers a slot and
// a layer's block takes 2 of them: blocks cross slots); layer 4: full attention; layer 0: SSM.
ManagerConfig small_model(bool scratch) {
  ManagerConfig c;
  c.tokens_per_block = 4;
  for (LayerId l = 1; l <= 3; ++l) {
    AttentionLayerConfig a;
    a.id = l;
    a.window = 6;
    a.buffers = {{"key", 32, {}, {}}};
    if (l != 3) a.buffers.push_back({"value", 32, {}, {}});
    c.attention_layers.push_back(a);
  }
  AttentionLayerConfig full;
  full.id = 4;
  full.buffers = {{"key", 32, {}, {}}, {"value", 32, {}, {}}};
  c.attention_layers.push_back(full);
  SsmLayerConfig ssm;
  ssm.id = 0;
  ssm.buffers = {{"ssm_state", 64, {}, {}}};
  c.ssm_layers.push_back(ssm);
  c.tiers.push_back({TierKind::kGpu, 4ull << 20, ""});
  c.swa_scratch_reuse = scratch;
  return c;
}

TEST(Scratch, ConverterMapsBlocksOntoSharedSlotsAndCrossesSlotBoundaries) {
  const StoragePlan plan = *StoragePlan::build(small_model(true));
  const CacheGroup& w = plan.cache_group(*plan.buffer_group_id(1, "key"));
  ASSERT_EQ(w.window, 6u);
  // One pool of 32 B buffers: 5 a slot (1.key, 1.value, 2.key, 2.value, 3.key); a layer's block
  // takes 2 of them.
  ASSERT_EQ(w.scratch.size(), 1u);
  EXPECT_EQ(w.scratch[0].pages_per_block, 2u);
  EXPECT_EQ(w.scratch[0].pages_per_slot, 5u);
  EXPECT_EQ(w.scratch_slots(3), 2u);  // 6 pages in slots of 5
  // Blocks 2..4 are scratch in slots 10 and 4; the rest of the table is ordinary.
  const std::vector<int32_t> table = {7, kBadPageIndex, kBadPageIndex, kBadPageIndex, kBadPageIndex,
                                      8};
  const ScratchDesc desc{2, 3, {10, 4}};
  auto convert = [&](LayerId layer, const char* role) {
    std::vector<int32_t> out(table.size());
    const Status s =
        plan.convert_page_indices(layer, role, IndexMode::kPerLayer, table, out, &desc);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
  };
  // Ordinary blocks (PER_LAYER): slot * 5 + offset / 32, offsets 0..4 for 1.key, 1.value,
  // 2.key, 2.value, 3.key. Scratch block j, page k of a layer: sub-page q = 2j + k, index
  // slots[q / 5] * 5 + q % 5. Layer 1 key (k 0): q 0, 2, 4 -> 50, 52, 54; value (k 1): q 1, 3,
  // 5 -> 51, 53 and, in the second slot, 4 * 5 + 0 = 20: block 4 crosses from slot 10 to 4.
  EXPECT_EQ(convert(1, "key"), (std::vector<int32_t>{35, kBadPageIndex, 50, 52, 54, 40}));
  EXPECT_EQ(convert(1, "value"), (std::vector<int32_t>{36, kBadPageIndex, 51, 53, 20, 41}));
  // Other layers share the same scratch pages (their kernels run one after the other).
  EXPECT_EQ(convert(2, "key"), (std::vector<int32_t>{37, kBadPageIndex, 50, 52, 54, 42}));
  EXPECT_EQ(convert(3, "key"), (std::vector<int32_t>{39, kBadPageIndex, 50, 52, 54, 44}));
  // Within a layer every scratch page is distinct.
  const std::vector<int32_t> k = convert(1, "key"), v = convert(1, "value");
  std::set<int32_t> pages;
  for (size_t b = 2; b < 5; ++b) pages.insert({k[b], v[b]});
  EXPECT_EQ(pages.size(), 6u);
  // Refused: SHARED mode, a buffer outside a window group, too few slots, a too-short table.
  std::vector<int32_t> out(table.size());
  EXPECT_FALSE(plan.convert_page_indices(1, "key", IndexMode::kShared, table, out, &desc).is_ok());
  EXPECT_FALSE(
      plan.convert_page_indices(4, "key", IndexMode::kPerLayer, table, out, &desc).is_ok());
  const ScratchDesc short_desc{2, 3, {10}};
  const Status few =
      plan.convert_page_indices(1, "key", IndexMode::kPerLayer, table, out, &short_desc);
  EXPECT_NE(few.message().find("need 6 pages; the descriptor has 1 slots of 5"), std::string::npos)
      << few.to_string();
  const ScratchDesc late{5, 3, {10, 4}};
  EXPECT_FALSE(
      plan.convert_page_indices(1, "key", IndexMode::kPerLayer, table, out, &late).is_ok());
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t h = (a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2))) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 29);
}

// A small model computed through the cache's pages: per step [h, c), the SSM layer folds the
// tokens into its state; each attention layer in turn writes K (and V) for every token of the
// step, then each token attends to its window (or everything) by reading the pages back. A
// layer's scratch pages are overwritten by the next layer: fine, as in a real model.
class TinyModel {
 public:
  explicit TinyModel(KvCacheManager& m) : m_(m), plan_(m.plan()) {}

  // Runs tokens [h, c) of `tokens` and returns the last position's output.
  uint64_t step(const KvCache& cache, const std::vector<int32_t>& tokens, uint64_t h, uint64_t c) {
    m_.wait(cache.ready_event());
    std::vector<uint64_t> x(tokens.begin() + static_cast<int64_t>(h),
                            tokens.begin() + static_cast<int64_t>(c));
    const CacheGroupId ssm = *plan_.buffer_group_id(0, "ssm_state");
    uint64_t* state = reinterpret_cast<uint64_t*>(address(0, "ssm_state", *cache.state_index(ssm)));
    if (h == 0) *state = 0;
    for (uint64_t v : x) *state = mix(*state, v);
    for (LayerId layer = 1; layer <= 4; ++layer) attention(cache, layer, h, c, x);
    return mix(x.back(), *state);
  }

 private:
  std::byte* address(LayerId layer, const char* role, int64_t index) {
    const PlannedBuffer& b = **plan_.find_buffer(layer, role);
    return m_.slot_address(TierKind::kGpu, b.pool_group, b.pool, 0) + index * b.size;
  }
  // Page indices of a buffer's blocks (PER_LAYER), scratch blocks included.
  std::vector<int32_t> pages(const KvCache& cache, LayerId layer, const char* role) {
    const CacheGroupId g = *plan_.buffer_group_id(layer, role);
    const std::span<const int32_t> table = *cache.block_table(g);
    const ScratchDesc scratch = *cache.scratch(g);
    std::vector<int32_t> out(table.size());
    EXPECT_TRUE(plan_.convert_page_indices(layer, role, IndexMode::kPerLayer, table, out, &scratch)
                    .is_ok());
    return out;
  }
  uint64_t* token(const std::vector<int32_t>& idx, LayerId layer, const char* role, uint64_t t) {
    const uint32_t tpb = plan_.config().tokens_per_block;
    EXPECT_NE(idx[t / tpb], kBadPageIndex) << "layer " << layer << " token " << t;
    return reinterpret_cast<uint64_t*>(address(layer, role, idx[t / tpb])) + t % tpb;
  }
  void attention(const KvCache& cache, LayerId layer, uint64_t h, uint64_t c,
                 std::vector<uint64_t>& x) {
    const bool has_value = layer != 3;
    const std::vector<int32_t> k = pages(cache, layer, "key");
    const std::vector<int32_t> v = has_value ? pages(cache, layer, "value") : k;
    for (uint64_t t = h; t < c; ++t) {
      *token(k, layer, "key", t) = mix(x[t - h], 2 * layer);
      if (has_value) *token(v, layer, "value", t) = mix(x[t - h], 2 * layer + 1);
    }
    const uint64_t w = layer == 4 ? UINT64_MAX : 6;
    for (uint64_t t = h; t < c; ++t) {
      uint64_t y = 0;
      for (uint64_t j = t + 1 > w ? t + 1 - w : 0; j <= t; ++j) {
        y = mix(y, *token(k, layer, "key", j));
        if (has_value) y = mix(y, *token(v, layer, "value", j));
      }
      x[t - h] = mix(x[t - h], y);
    }
  }

  KvCacheManager& m_;
  const StoragePlan& plan_;
};

struct TinyRun {
  std::vector<uint64_t> outputs;
  uint64_t scratch_blocks = 0;
  uint64_t fewest_free = UINT64_MAX;  // window pool group's free GPU slots, lowest seen
};

// A 64-token prompt prefilled in chunks of 30, 20 and 14, then ten decode steps.
TinyRun run_tiny(bool scratch) {
  auto m =
      std::move(KvCacheManager::create(small_model(scratch), BackendOptions{BackendKind::kHost}))
          .value();
  TinyModel model(*m);
  std::mt19937_64 rng(11);
  std::vector<int32_t> tokens(64);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 1000);
  auto cache = std::move(m->create_kv_cache({{}, tokens, 1, {}, {}, {}})).value();
  EXPECT_TRUE(cache->resume({}).is_ok());
  const CacheGroupId window = *m->plan().buffer_group_id(1, "key");
  const PoolGroupId pool = m->plan().cache_group(window).pool_group;
  TinyRun out;
  uint64_t h = 0;
  auto step = [&](uint64_t c) {
    const Status s = cache->resize(c, h);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    out.scratch_blocks += cache->scratch(window)->num_blocks;
    out.fewest_free =
        std::min(out.fewest_free, m->storage_stats().tiers[0].pool_groups[pool.value].free_slots);
    out.outputs.push_back(model.step(*cache, tokens, h, c));
    h = c;
  };
  for (uint64_t c : {30u, 50u, 64u}) step(c);
  for (int i = 0; i < 10; ++i) {
    tokens.push_back(static_cast<int32_t>(out.outputs.back() % 1000));
    step(h + 1);
  }
  EXPECT_EQ(testing::check_invariants(*m), "");
  return out;
}

TEST(Scratch, TinyModelComputesTheSameTokensWithScratchOnAndOff) {
  const TinyRun off = run_tiny(false), on = run_tiny(true);
  EXPECT_EQ(on.outputs, off.outputs);
  EXPECT_EQ(off.scratch_blocks, 0u);
  // Window 6, 4 tokens a block. [0, 30): from 30 on a step reads tokens 25.., block 6: blocks
  // 0..5 are scratch. [30, 50): reads from 45 (block 11): new blocks 8..10. [50, 64): reads
  // from 59 (block 14): block 13. Decode steps: none. 6 + 3 + 1 = 10.
  EXPECT_EQ(on.scratch_blocks, 10u);
  EXPECT_GT(on.fewest_free, off.fewest_free);  // fewer window pages at the fullest moment
}

TEST(Scratch, LongPromptTakesAFewScratchSlotsInsteadOfAWindowPageABlock) {
  // GPT-OSS-20B: 12 window layers (128 tokens) with a key and a value each, 32 tokens a block:
  // the window pool has 24 pages a slot and a layer's block takes 2.
  Result<ModelDescription> model =
      read_model_config(std::string(HKV_MODELS_DIR) + "/gpt_oss_20b.json", {});
  ASSERT_TRUE(model.is_ok());
  auto build = [&](bool scratch) {
    ManagerConfig c;
    c.tokens_per_block = 32;
    c.attention_layers = model.value().attention_layer_configs(32);
    c.tiers.push_back({TierKind::kGpu, 40ull << 30, ""});
    c.swa_scratch_reuse = scratch;
    return std::move(KvCacheManager::create(c, {BackendKind::kNone})).value();
  };
  std::vector<int32_t> prompt(32768, 5);
  for (const bool scratch : {false, true}) {
    SCOPED_TRACE(scratch ? "scratch on" : "scratch off");
    auto m = build(scratch);
    const CacheGroupId window(1);
    ASSERT_EQ(m->plan().cache_group(window).window, 128u);
    const uint64_t free0 = m->storage_stats().tiers[0].pool_groups[0].free_slots;
    auto a = std::move(m->create_kv_cache({{}, prompt, 1, {}, {}, {}})).value();
    ASSERT_OK(a->resume({}));
    ASSERT_OK(a->resize(32768, 0));  // the whole prompt in one step
    const uint64_t used = free0 - m->storage_stats().tiers[0].pool_groups[0].free_slots;
    const ScratchDesc d = *a->scratch(window);
    if (!scratch) {
      // 1,024 full blocks + 1,024 window blocks (all live at history 0).
      EXPECT_EQ(used, 2048u);
      EXPECT_EQ(d.num_blocks, 0u);
      continue;
    }
    // From 32,768 on a step reads tokens 32,641.. (block 1,020): blocks 0..1019 are scratch,
    // 1,020 x 2 pages in slots of 24 = 85 slots; the window keeps 4 pages of its own.
    EXPECT_EQ(d.first_block, 0u);
    EXPECT_EQ(d.num_blocks, 1020u);
    EXPECT_EQ(d.slots.size(), 85u);
    EXPECT_EQ(used, 1024u + 4 + 85);
    EXPECT_EQ((*a->block_table(window))[0], kBadPageIndex);
    EXPECT_NE((*a->block_table(window))[1020], kBadPageIndex);
    // The commit that covers the step ends the scratch slots' use; none reach the tree.
    ASSERT_OK(a->resize(32768, 32768));
    EXPECT_EQ(a->scratch(window)->num_blocks, 0u);
    ASSERT_OK(a->commit(prompt));
    EXPECT_EQ(free0 - m->storage_stats().tiers[0].pool_groups[0].free_slots, 1024u + 4);
    for (const testing::TreePage& t : testing::tree_pages(*m)) {
      if (t.group == window) {
        EXPECT_GE(t.start, 1020u * 32);
      }
    }
    EXPECT_EQ(testing::check_invariants(*m), "");
  }
}

TEST(Scratch, BadSettingsAndCallsAreNamed) {
  ManagerConfig c = small_model(true);
  c.max_rewind_len = -5;
  EXPECT_NE(validate_config(c).message().find("max_rewind_len -5 must be >= 0"), std::string::npos);
  c = small_model(true);
  for (AttentionLayerConfig& l : c.attention_layers) l.window.reset();
  EXPECT_NE(validate_config(c).message().find("swa_scratch_reuse is on but no attention layer"),
            std::string::npos);
  c = small_model(true);
  c.max_rewind_len = 1ll << 30;  // beyond the longest request 4 MiB holds
  const Result<StoragePlan> beyond = StoragePlan::build(c);
  ASSERT_FALSE(beyond.is_ok());
  EXPECT_NE(beyond.status().message().find("is beyond the longest request"), std::string::npos)
      << beyond.status().to_string();
  // A request cannot ask for scratch that the plan did not reserve.
  auto off =
      std::move(KvCacheManager::create(small_model(false), BackendOptions{BackendKind::kHost}))
          .value();
  std::vector<int32_t> tokens(40, 1);
  EXPECT_EQ(off->create_kv_cache({{}, tokens, 1, {}, true, {}}).status().code(),
            StatusCode::kInvalidArgument);
  auto cache = std::move(off->create_kv_cache({{}, tokens, 1, {}, {}, {}})).value();
  EXPECT_EQ(cache->set_swa_scratch(true).code(), StatusCode::kInvalidArgument);
  // With scratch: a step leaves scratch blocks; the next may not rewind below capacity -
  // max_rewind_len (here 2), and a per-request switch turns it off.
  c = small_model(true);
  c.max_rewind_len = 2;
  auto m = std::move(KvCacheManager::create(c, BackendOptions{BackendKind::kHost})).value();
  auto a = std::move(m->create_kv_cache({{}, tokens, 1, {}, {}, {}})).value();
  ASSERT_OK(a->resume({}));
  ASSERT_OK(a->resize(40, 0));
  const CacheGroupId window = *m->plan().buffer_group_id(1, "key");
  // Settled point 38: reads from 33 (block 8): blocks 0..7 are scratch.
  EXPECT_EQ(a->scratch(window)->num_blocks, 8u);
  const Status rewind = a->resize(40, 37);
  EXPECT_EQ(rewind.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(rewind.message().find("rewinds past 38"), std::string::npos) << rewind.message();
  ASSERT_OK(a->resize(40, 38));
  auto b = std::move(m->create_kv_cache({{}, tokens, 1, {}, false, {}})).value();
  ASSERT_OK(b->resume({}));
  ASSERT_OK(b->resize(40, 0));
  EXPECT_EQ(b->scratch(window)->num_blocks, 0u);
  ASSERT_OK(b->set_swa_scratch(true));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

}  // namespace
}  // namespace hybridkv
