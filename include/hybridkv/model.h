// Model descriptions: HuggingFace `config.json` files read into cache layers.
//
// A ModelDescription lists, for one tensor-parallel rank, every cache layer a model needs: an
// attention layer (GQA key/value or an MLA latent, optional sliding window) or a recurrent layer
// (Mamba1, Mamba2, gated delta net, Kimi delta attention) with its conv and SSM state. A model
// layer that holds both an attention and a recurrent mixer (Falcon-H1, Zamba2's hybrid layers)
// becomes two cache layers. Cache layer ids are dense, in model-layer order, attention before
// recurrent within one model layer; `model_layer` keeps the checkpoint's 0-based index.
//
// Families (by `model_type`): nemotron_h, mamba2, granitemoehybrid, falcon_h1, zamba2 (Mamba2);
// qwen3_next (GDN); kimi_linear (KDA + MLA); jamba (Mamba1); mistral, llama, qwen2, qwen3,
// gemma3_text (attention with optional sliding windows). Keys that start with '_' are ignored.
//
// Thread-safety: value types; the readers are pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/status.h"

namespace hybridkv {

// kShortConv: a gated short convolution (LFM2): a conv state only, no SSM state.
enum class MixerKind : uint8_t { kAttention, kMla, kMamba1, kMamba2, kGdn, kKda, kShortConv };
const char* mixer_kind_name(MixerKind kind);  // "attention", "mla", "mamba1", ...

// Per-rank shape of a recurrent layer, for replay buffers and diagnostics.
struct RecurrentShape {
  uint64_t num_heads = 0;    // Mamba2: SSM heads; GDN: value heads; KDA: heads; Mamba1: 0
  uint64_t head_dim = 0;     // Mamba2: head dim; GDN: value head dim; KDA: head dim
  uint64_t state_size = 0;   // Mamba1/2: d_state; GDN: key head dim; KDA: head dim
  uint64_t n_groups = 0;     // Mamba2: B/C groups on this rank; GDN: key heads; KDA: heads
  uint64_t d_inner = 0;      // channels of the mixer on this rank
  uint64_t conv_dim = 0;     // channels of the conv window on this rank
  uint64_t conv_kernel = 0;  // K; the conv state keeps K - 1 columns
};

struct ModelLayer {
  LayerId cache_layer = 0;
  uint32_t model_layer = 0;
  MixerKind mixer = MixerKind::kAttention;
  // Attention (kAttention, kMla):
  std::optional<uint32_t> window;      // sliding window in tokens
  uint64_t kv_heads = 0;               // per rank (MLA: 1 latent head, never split)
  uint64_t head_dim = 0;               // elements per head (MLA: kv_lora_rank + rope dim)
  uint64_t kv_elements_per_token = 0;  // GQA: 2 * kv_heads * head_dim; MLA: head_dim
  // Recurrent:
  uint64_t conv_elements = 0;  // per sequence
  uint64_t ssm_elements = 0;   // per sequence
  RecurrentShape shape;

  bool is_attention() const { return mixer == MixerKind::kAttention || mixer == MixerKind::kMla; }
};

struct ModelOptions {
  uint32_t tp_size = 1;             // tensor-parallel ranks; numbers are per rank
  DType kv_dtype = DType::kBF16;    // KV cache elements
  DType conv_dtype = DType::kBF16;  // conv window elements
  std::optional<DType> ssm_dtype;   // unset: the config's mamba_ssm_cache_dtype /
                                    // mamba_ssm_dtype, else fp32
};

struct ModelDescription {
  std::string source;  // file name or label, for messages
  std::string model_type;
  std::string family;  // "Mamba2", "GDN", "KDA + MLA", "Mamba1", "attention", ...
  uint32_t num_model_layers = 0;
  uint32_t num_mtp_layers = 0;  // num_nextn_predict_layers: speculative (MTP) layers
  std::optional<uint64_t> max_position_embeddings;
  uint32_t tp_size = 1;
  DType kv_dtype = DType::kBF16;
  DType conv_dtype = DType::kBF16;
  DType ssm_dtype = DType::kF32;
  std::vector<ModelLayer> layers;

  // KV bytes of one token over all attention layers (full + sliding).
  uint64_t kv_bytes_per_token() const;
  uint64_t full_kv_bytes_per_token() const;
  uint64_t sliding_kv_bytes_per_token() const;
  // Recurrent state of one sequence over all recurrent layers (SSM + conv).
  uint64_t state_bytes_per_sequence() const;
  uint64_t ssm_bytes_per_sequence() const;
  uint64_t conv_bytes_per_sequence() const;
  size_t num_attention_layers() const;
  size_t num_recurrent_layers() const;

  // Layer configs for a ManagerConfig: attention buffers "key"/"value" (GQA) or "mla_latent"
  // (MLA) of tokens_per_block tokens each; recurrent buffers "conv_state" and "ssm_state".
  std::vector<AttentionLayerConfig> attention_layer_configs(uint32_t tokens_per_block) const;
  std::vector<SsmLayerConfig> ssm_layer_configs() const;
};

// Reads a config from JSON text; `source` names it in error messages.
Result<ModelDescription> parse_model_config(std::string_view json_text, const ModelOptions& options,
                                            std::string_view source = "config");
// Reads a config file; errors name the path.
Result<ModelDescription> read_model_config(const std::string& path, const ModelOptions& options);

}  // namespace hybridkv
