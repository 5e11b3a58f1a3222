// HuggingFace config reading: bytes per token and per sequence of every bundled model, TP
// splitting, layer layouts per family, and errors that name the field.
#include <gtest/gtest.h>

#include "hybridkv/model.h"
#include "hybridkv/plan.h"

namespace hybridkv {
namespace {

std::string model_path(const std::string& name) { return std::string(HKV_MODELS_DIR) + "/" + name; }

ModelDescription read_ok(const std::string& name, ModelOptions options = {}) {
  Result<ModelDescription> m = read_model_config(model_path(name), options);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m).value();
}

struct TableRow {
  const char* file;
  uint64_t kv_bytes_per_token;
  uint64_t state_bytes_per_sequence;
  size_t attention_layers;
  size_t recurrent_layers;
};

// ../shared/models/README.md, TP 1, KV and conv bf16, SSM fp32.
const TableRow kTable[] = {
    {"nemotron_h_8b.json", 16384, 102137856, 4, 24},
    {"nemotron_nano_9b_v2.json", 16384, 143548416, 4, 27},
    {"nemotron_3_nano_30b_a3b.json", 6144, 49082368, 6, 23},
    {"qwen3_next_80b_a3b.json", 24576, 77266944, 12, 36},
    {"jamba_v0_1.json", 16384, 16056320, 4, 28},
    {"falcon_h1_7b.json", 45056, 139358208, 44, 44},
    {"granite_4_0_h_tiny.json", 8192, 57341952, 4, 36},
    {"granite_4_0_h_small.json", 16384, 152819712, 4, 36},
    {"kimi_linear_48b_a3b.json", 8064, 43417600, 7, 20},
    {"zamba2_2_7b.json", 184320, 72479232, 9, 54},
    {"mamba2_2_7b.json", 0, 169836544, 0, 64},
    {"mistral_7b_v0_1.json", 131072, 0, 32, 0},
    {"gemma_3_270m.json", 18432, 0, 18, 0},
    // Not in the shared table: 2 (K, V) x 8 KV heads x 64 x 2 B = 2,048 B a layer x 24.
    {"gpt_oss_20b.json", 49152, 0, 24, 0},
    // 2 x 8 KV heads x 256 x 2 B = 8,192 B a layer x 48.
    {"gemma_3_12b.json", 393216, 0, 48, 0},
    // Issue 30 item 5 (models/README.md has the arithmetic): Qwen3.5-27B 16 full layers x 2 x 4
    // KV heads x 256 x 2 B; 48 GDN layers of (2*16*128 + 48*128) * 3 bf16 conv + 48*128*128 fp32.
    {"qwen3_5_27b.json", 65536, 153944064, 16, 48},
    // Bamba-9B: 3 attention layers x 2 x 8 x 128 x 2 B; 29 Mamba2 layers of
    // (8192 + 2*1*128) * 3 bf16 conv + 128*64*128 fp32 SSM.
    {"bamba_9b.json", 12288, 123104768, 3, 29},
    // LFM2-350M: 6 attention layers x 2 x 8 x 64 x 2 B; 10 short convolutions of 1024 * 2 bf16.
    {"lfm2_350m.json", 12288, 40960, 6, 10},
};

TEST(ModelConfig, EveryBundledModelMatchesTheSizeTable) {
  for (const TableRow& row : kTable) {
    SCOPED_TRACE(row.file);
    const ModelDescription m = read_ok(row.file);
    EXPECT_EQ(m.kv_bytes_per_token(), row.kv_bytes_per_token);
    EXPECT_EQ(m.state_bytes_per_sequence(), row.state_bytes_per_sequence);
    EXPECT_EQ(m.num_attention_layers(), row.attention_layers);
    EXPECT_EQ(m.num_recurrent_layers(), row.recurrent_layers);
  }
}

TEST(ModelConfig, PerLayerStateMatchesTheTable) {
  // One recurrent layer's state (fp32 SSM + bf16 conv) from the README's per-layer figures.
  const std::pair<const char*, uint64_t> rows[] = {
      {"nemotron_h_8b.json", 4255744},
      {"nemotron_nano_9b_v2.json", 5316608},
      {"nemotron_3_nano_30b_a3b.json", 2134016},
      {"qwen3_next_80b_a3b.json", 2146304},
      {"jamba_v0_1.json", 573440},
      {"falcon_h1_7b.json", 3167232},
      {"granite_4_0_h_tiny.json", 1592832},
      {"granite_4_0_h_small.json", 4244992},
      {"kimi_linear_48b_a3b.json", 2170880},
      {"zamba2_2_7b.json", 1342208},
      {"qwen3_5_27b.json", 3207168},
      {"bamba_9b.json", 4244992},
      {"lfm2_350m.json", 4096},
  };
  for (const auto& [file, bytes] : rows) {
    SCOPED_TRACE(file);
    const ModelDescription m = read_ok(file);
    for (const ModelLayer& l : m.layers) {
      if (l.is_attention()) continue;
      EXPECT_EQ(l.ssm_elements * 4 + l.conv_elements * 2, bytes);
    }
  }
}

TEST(ModelConfig, LayerLayoutsFollowEachFamilysSpelling) {
  auto attention_model_layers = [](const ModelDescription& m) {
    std::vector<uint32_t> out;
    for (const ModelLayer& l : m.layers)
      if (l.is_attention()) out.push_back(l.model_layer);
    return out;
  };
  EXPECT_EQ(attention_model_layers(read_ok("nemotron_h_8b.json")),
            (std::vector<uint32_t>{7, 18, 29, 40}));
  EXPECT_EQ(attention_model_layers(read_ok("jamba_v0_1.json")),
            (std::vector<uint32_t>{4, 12, 20, 28}));
  EXPECT_EQ(attention_model_layers(read_ok("kimi_linear_48b_a3b.json")),
            (std::vector<uint32_t>{3, 7, 11, 15, 19, 23, 26}));  // published 1-based
  const std::vector<uint32_t> qwen = attention_model_layers(read_ok("qwen3_next_80b_a3b.json"));
  ASSERT_EQ(qwen.size(), 12u);
  EXPECT_EQ(qwen.front(), 3u);
  EXPECT_EQ(qwen.back(), 47u);
  EXPECT_EQ(attention_model_layers(read_ok("zamba2_2_7b.json")),
            (std::vector<uint32_t>{6, 12, 18, 24, 30, 36, 42, 47, 51}));
}

// transformers 5 writes Nemotron-H's pattern as a layers_block_type list (its own cache names
// included); it reads as the same layers as hybrid_override_pattern.
TEST(ModelConfig, NemotronLayersBlockTypeEqualsThePattern) {
  const std::string common = R"("model_type": "nemotron_h", "num_hidden_layers": 4,
      "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 16,
      "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4, )";
  Result<ModelDescription> pattern = parse_model_config(
      "{" + common + R"("hybrid_override_pattern": "M*M-"})", ModelOptions{}, "pattern");
  Result<ModelDescription> list = parse_model_config(
      "{" + common +
          R"("layers_block_type": ["linear_attention", "full_attention", "mamba", "mlp"]})",
      ModelOptions{}, "list");
  ASSERT_TRUE(pattern.is_ok()) << pattern.status().to_string();
  ASSERT_TRUE(list.is_ok()) << list.status().to_string();
  ASSERT_EQ(list->layers.size(), pattern->layers.size());
  for (size_t i = 0; i < list->layers.size(); ++i) {
    EXPECT_EQ(list->layers[i].model_layer, pattern->layers[i].model_layer);
    EXPECT_EQ(list->layers[i].mixer, pattern->layers[i].mixer);
  }
  EXPECT_EQ(list->state_bytes_per_sequence(), pattern->state_bytes_per_sequence());
  Result<ModelDescription> bad = parse_model_config(
      "{" + common + R"("layers_block_type": ["mamba", "conv", "mamba", "mlp"]})", ModelOptions{},
      "bad");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("layers_block_type[1]"), std::string::npos)
      << bad.status().to_string();
}

// Granite-4.0-H's layer_types as transformers 5 writes them (its cache names).
// Pure Mamba1 (state-spaces/mamba, Falcon-Mamba): every layer a Mamba1 mixer of
// intermediate_size channels: conv d_inner * (K - 1), ssm d_inner * d_state.
TEST(ModelConfig, PureMamba1ModelsArePlanned) {
  for (const char* type : {"mamba", "falcon_mamba"}) {
    SCOPED_TRACE(type);
    const std::string json = std::string(R"({"model_type": ")") + type +
                             R"(", "hidden_size": 64, "num_hidden_layers": 3, "state_size": 8,
        "expand": 2, "intermediate_size": 128, "conv_kernel": 4})";
    Result<ModelDescription> m = parse_model_config(json, {}, "test");
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_EQ(m->layers.size(), 3u);
    EXPECT_EQ(m->family, "Mamba1");
    EXPECT_EQ(m->layers[0].mixer, MixerKind::kMamba1);
    EXPECT_EQ(m->layers[0].conv_elements, 128u * 3);
    EXPECT_EQ(m->layers[0].ssm_elements, 128u * 8);
  }
}

// Issue 30: Bamba (Mamba2 + attention at attn_layer_indices), Qwen3.5 (gated delta net) and
// the multimodal wrappers, planned from their text_config.
TEST(ModelConfig, BambaQwen35AndWrappersArePlanned) {
  Result<ModelDescription> bamba = parse_model_config(
      R"({"model_type": "bamba", "num_hidden_layers": 4, "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2, "attn_layer_indices": [1, 3],
          "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16,
          "mamba_d_conv": 4, "mamba_expand": 2})",
      ModelOptions{}, "bamba");
  ASSERT_TRUE(bamba.is_ok()) << bamba.status().to_string();
  ASSERT_EQ(bamba->layers.size(), 4u);
  EXPECT_EQ(bamba->layers[1].mixer, MixerKind::kAttention);
  EXPECT_EQ(bamba->layers[1].kv_elements_per_token, 2u * 2 * 16);
  EXPECT_EQ(bamba->layers[0].mixer, MixerKind::kMamba2);
  // conv (d_inner + 2 * n_groups * d_state) * (K - 1); ssm n_heads * head_dim * d_state.
  EXPECT_EQ(bamba->layers[0].conv_elements, (128u + 2 * 2 * 16) * 3);
  EXPECT_EQ(bamba->layers[0].ssm_elements, 8u * 16 * 16);
  const std::string text = R"({"model_type": "qwen3_5_text", "num_hidden_layers": 2,
      "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
      "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
      "linear_conv_kernel_dim": 4, "layer_types": ["linear_attention", "full_attention"]})";
  Result<ModelDescription> qwen = parse_model_config(text, ModelOptions{}, "qwen3_5_text");
  ASSERT_TRUE(qwen.is_ok()) << qwen.status().to_string();
  ASSERT_EQ(qwen->layers.size(), 2u);
  EXPECT_EQ(qwen->layers[0].mixer, MixerKind::kGdn);
  EXPECT_EQ(qwen->layers[0].ssm_elements, 4u * 16 * 16);
  // OLMo-Hybrid spells its gated delta net layers as Qwen3.5 does.
  std::string olmo_text = text;
  olmo_text.replace(olmo_text.find("qwen3_5_text"), 12, "olmo_hybrid");
  Result<ModelDescription> olmo = parse_model_config(olmo_text, ModelOptions{}, "olmo_hybrid");
  ASSERT_TRUE(olmo.is_ok()) << olmo.status().to_string();
  EXPECT_EQ(olmo->layers[0].mixer, MixerKind::kGdn);
  EXPECT_EQ(olmo->layers[0].ssm_elements, qwen->layers[0].ssm_elements);
  Result<ModelDescription> wrapped = parse_model_config(
      R"({"model_type": "qwen3_5", "vision_config": {"depth": 2}, "text_config": )" + text + "}",
      ModelOptions{}, "qwen3_5");
  ASSERT_TRUE(wrapped.is_ok()) << wrapped.status().to_string();
  EXPECT_EQ(wrapped->model_type, "qwen3_5");
  ASSERT_EQ(wrapped->layers.size(), 2u);
  EXPECT_EQ(wrapped->layers[0].ssm_elements, qwen->layers[0].ssm_elements);
  Result<ModelDescription> bare = parse_model_config(R"({"model_type": "qwen3_5"})", {}, "w");
  ASSERT_FALSE(bare.is_ok());
  EXPECT_NE(bare.status().message().find("text_config"), std::string::npos)
      << bare.status().message();
}

// Issue 30: Kimi-Linear as transformers 5 writes it (layer_types and linear_* fields) plans the
// same layers as the checkpoint's linear_attn_config.
TEST(ModelConfig, KimiLinearTakesTransformersFields) {
  const std::string common = R"("model_type": "kimi_linear", "num_hidden_layers": 4,
      "kv_lora_rank": 16, "qk_rope_head_dim": 8)";
  Result<ModelDescription> ours =
      parse_model_config("{" + common + R"(, "linear_num_heads": 2, "linear_head_dim": 16,
      "linear_conv_kernel_dim": 4,
      "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]})",
                         ModelOptions{}, "transformers");
  Result<ModelDescription> checkpoint =
      parse_model_config("{" + common + R"(, "linear_attn_config": {"num_heads": 2, "head_dim": 16,
      "short_conv_kernel_size": 4, "full_attn_layers": [2, 4], "kda_layers": [1, 3]}})",
                         ModelOptions{}, "checkpoint");
  ASSERT_TRUE(ours.is_ok()) << ours.status().to_string();
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.status().to_string();
  ASSERT_EQ(ours->layers.size(), 4u);
  ASSERT_EQ(checkpoint->layers.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ours->layers[i].mixer, i % 2 ? MixerKind::kMla : MixerKind::kKda) << i;
    EXPECT_EQ(ours->layers[i].mixer, checkpoint->layers[i].mixer) << i;
    EXPECT_EQ(ours->layers[i].conv_elements, checkpoint->layers[i].conv_elements) << i;
    EXPECT_EQ(ours->layers[i].ssm_elements, checkpoint->layers[i].ssm_elements) << i;
    EXPECT_EQ(ours->layers[i].kv_elements_per_token, checkpoint->layers[i].kv_elements_per_token);
  }
  // KDA: conv 3 * H * D * (K - 1); state H * D * D. MLA: kv_lora_rank + rope per token.
  EXPECT_EQ(ours->layers[0].conv_elements, 3u * 2 * 16 * 3);
  EXPECT_EQ(ours->layers[0].ssm_elements, 2u * 16 * 16);
  EXPECT_EQ(ours->layers[1].kv_elements_per_token, 16u + 8);
}

TEST(ModelConfig, GraniteTakesTransformersLayerNames) {
  Result<ModelDescription> m = parse_model_config(
      R"({"model_type": "granitemoehybrid", "num_hidden_layers": 3, "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 8,
          "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 2, "mamba_d_conv": 4,
          "layer_types": ["linear_attention", "full_attention", "mamba"]})",
      ModelOptions{}, "granite");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->num_attention_layers(), 1u);
  EXPECT_EQ(m->num_recurrent_layers(), 2u);
}

TEST(ModelConfig, ParallelHybridLayerBecomesTwoCacheLayers) {
  const ModelDescription m = read_ok("falcon_h1_7b.json");
  ASSERT_EQ(m.layers.size(), 88u);
  EXPECT_EQ(m.layers[0].model_layer, 0u);
  EXPECT_EQ(m.layers[0].mixer, MixerKind::kAttention);
  EXPECT_EQ(m.layers[1].model_layer, 0u);
  EXPECT_EQ(m.layers[1].mixer, MixerKind::kMamba2);
  EXPECT_EQ(m.layers[1].cache_layer, 1);
  EXPECT_EQ(m.layers[87].model_layer, 43u);
}

TEST(ModelConfig, MlaLatentIsOneUnsplitHead) {
  ModelOptions tp4;
  tp4.tp_size = 4;
  const ModelDescription m = read_ok("kimi_linear_48b_a3b.json", tp4);
  for (const ModelLayer& l : m.layers) {
    if (l.mixer != MixerKind::kMla) continue;
    EXPECT_EQ(l.kv_elements_per_token, 576u);  // kv_lora_rank 512 + rope 64, at any TP
  }
  EXPECT_EQ(m.kv_bytes_per_token(), 8064u);
  EXPECT_EQ(m.state_bytes_per_sequence(), 43417600u / 4);  // KDA splits by heads
  const auto attention = m.attention_layer_configs(16);
  ASSERT_EQ(attention.size(), 7u);
  ASSERT_EQ(attention[0].buffers.size(), 1u);
  EXPECT_EQ(attention[0].buffers[0].role, "mla_latent");
  EXPECT_EQ(attention[0].buffers[0].bytes_per_page, 576u * 2 * 16);
}

TEST(ModelConfig, TensorParallelSplitsHeadsAndReplicatesGroups) {
  ModelOptions tp2;
  tp2.tp_size = 2;
  // Nemotron-H-8B: 8 groups split 4 per rank. conv (64*128/2 + 2*4*128) * 3 = 15,360 elements.
  const ModelDescription nemotron = read_ok("nemotron_h_8b.json", tp2);
  EXPECT_EQ(nemotron.layers[0].conv_elements, (4096u + 1024u) * 3);
  EXPECT_EQ(nemotron.layers[0].ssm_elements, 64u * 64 * 128);
  EXPECT_EQ(nemotron.kv_bytes_per_token(), 16384u / 2);
  // Granite-Tiny: 1 group is replicated, so each rank keeps 2*1*128 B/C channels.
  const ModelDescription granite = read_ok("granite_4_0_h_tiny.json", tp2);
  for (const ModelLayer& l : granite.layers) {
    if (l.is_attention()) continue;
    EXPECT_EQ(l.shape.n_groups, 1u);
    EXPECT_EQ(l.conv_elements, (48u * 64 / 2 + 2 * 128) * 3);
  }
  // Qwen3-Next at TP 4: 2 KV heads are replicated, one per rank.
  ModelOptions tp4;
  tp4.tp_size = 4;
  const ModelDescription qwen = read_ok("qwen3_next_80b_a3b.json", tp4);
  EXPECT_EQ(qwen.full_kv_bytes_per_token(), 12u * 2 * 1 * 256 * 2);
  EXPECT_EQ(qwen.layers[0].conv_elements, (2u * 4 * 128 + 8 * 128) * 3);
}

TEST(ModelConfig, TensorParallelThatDoesNotDivideIsRejected) {
  ModelOptions tp3;
  tp3.tp_size = 3;
  Result<ModelDescription> m = read_model_config(model_path("nemotron_h_8b.json"), tp3);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("is not divisible by tp 3"), std::string::npos)
      << m.status().message();
}

TEST(ModelConfig, DtypesFollowOptionsAndTheConfig) {
  ModelOptions bf16;
  bf16.ssm_dtype = DType::kBF16;
  EXPECT_EQ(read_ok("nemotron_h_8b.json", bf16).state_bytes_per_sequence(), 51806208u);
  // nemotron_3_nano asks for fp32 SSM state itself.
  EXPECT_EQ(read_ok("nemotron_3_nano_30b_a3b.json").ssm_dtype, DType::kF32);
  ModelOptions fp8;
  fp8.kv_dtype = DType::kFP8E4M3;
  EXPECT_EQ(read_ok("nemotron_h_8b.json", fp8).kv_bytes_per_token(), 8192u);
}

TEST(ModelConfig, SlidingWindowsComeThroughToTheLayerConfigs) {
  const ModelDescription gemma = read_ok("gemma_3_270m.json");
  const auto layers = gemma.attention_layer_configs(32);
  int sliding = 0;
  for (const AttentionLayerConfig& l : layers) sliding += l.window == 512u ? 1 : 0;
  EXPECT_EQ(sliding, 15);
  ManagerConfig c;
  c.attention_layers = layers;
  c.tiers.push_back({TierKind::kGpu, 1ull << 30, ""});
  const StoragePlan plan = *StoragePlan::build(c);
  ASSERT_EQ(plan.cache_groups().size(), 2u);
  EXPECT_FALSE(plan.cache_groups()[0].window.has_value());
  EXPECT_EQ(plan.cache_groups()[1].one_request_slots, 512u / 32 + 1);
}

struct BadConfig {
  const char* json;
  const char* expected;
};

TEST(ModelConfig, BadConfigsNameTheFieldAndValue) {
  const BadConfig cases[] = {
      {"{", "malformed JSON at byte 2"},
      {R"({"model_type": 2e62144})", "malformed JSON"},  // a number beyond double (fuzz-found)
      {"[1, 2]", "the top level must be a JSON object"},
      {R"({"num_hidden_layers": 2})", "field 'model_type': is missing"},
      {R"({"model_type": "gpt5"})", "field 'model_type': 'gpt5' is unknown"},
      {R"({"model_type": 7})", "field 'model_type': 7 must be a string"},
      {R"({"model_type": "mamba2", "num_hidden_layers": -1})",
       "field 'num_hidden_layers': -1 must be a non-negative integer"},
      {R"({"model_type": "mamba2", "num_hidden_layers": "two"})",
       "field 'num_hidden_layers': \"two\" must be a non-negative integer"},
      {R"({"model_type": "mamba2", "num_hidden_layers": 2, "num_heads": 0})",
       "field 'num_heads': 0 must be > 0"},
      {R"({"model_type": "mamba2", "num_hidden_layers": 2, "num_heads": 8, "head_dim": 64,
           "state_size": 16, "n_groups": 1, "conv_kernel": 1})",
       "field 'conv_kernel': 1 must be >= 2"},
      {R"({"model_type": "nemotron_h", "hybrid_override_pattern": "M*X"})",
       "field 'hybrid_override_pattern': character 'X' at 2 is not one of M * - E"},
      {R"({"model_type": "granitemoehybrid", "layer_types": ["mamba", "mlp"]})",
       "field 'layer_types[1]': \"mlp\" is not one of attention, full_attention, linear_attention, "
       "mamba"},
      {R"({"model_type": "kimi_linear", "num_hidden_layers": 2, "linear_attn_config": 3})",
       "field 'linear_attn_config': 3 must be an object"},
      {R"({"model_type": "kimi_linear", "num_hidden_layers": 2,
           "linear_attn_config": {"full_attn_layers": [0]}})",
       "field 'linear_attn_config.full_attn_layers[0]': 0 is not a 1-based layer number"},
      {R"({"model_type": "jamba", "num_hidden_layers": 4, "attn_layer_period": 2,
           "attn_layer_offset": 2})",
       "field 'attn_layer_offset': 2 must be < attn_layer_period 2"},
      {R"({"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "sliding_window": 99999999})",
       "field 'sliding_window': 99999999 is larger than"},
      {R"({"model_type": "qwen3_next", "num_hidden_layers": 4, "full_attention_interval": 2,
           "num_key_value_heads": 2, "head_dim": 8, "linear_num_key_heads": 2,
           "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4})",
       "field 'linear_num_value_heads': is missing"},
  };
  for (const BadConfig& c : cases) {
    SCOPED_TRACE(c.json);
    Result<ModelDescription> m = parse_model_config(c.json, ModelOptions{}, "test.json");
    ASSERT_FALSE(m.is_ok());
    EXPECT_EQ(m.status().message().rfind("test.json: ", 0), 0u) << m.status().message();
    EXPECT_NE(m.status().message().find(c.expected), std::string::npos) << m.status().message();
  }
}

TEST(ModelConfig, MissingFileIsNotFound) {
  Result<ModelDescription> m = read_model_config("/nonexistent/config.json", ModelOptions{});
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m.status().message(), "/nonexistent/config.json: cannot open the file");
}

TEST(ModelConfig, UnderscoreKeysAreIgnored) {
  Result<ModelDescription> m = parse_model_config(
      R"({"_notes": ["anything"], "_verified": 12, "model_type": "mistral", "num_hidden_layers": 2,
          "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2})",
      ModelOptions{});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->kv_bytes_per_token(), 2u * 2 * 2 * 16 * 2);
}

}  // namespace
}  // namespace hybridkv
