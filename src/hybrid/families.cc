// Cache layers per model family. Formulas (elements per rank; TP splits heads and channels):
//   GQA attention, per token:  2 * kv_heads * head_dim   (kv_heads < tp: replicated, 1 per rank)
//   MLA attention, per token:  kv_lora_rank + qk_rope_head_dim   (one latent head, never split)
//   Mamba1: conv d_inner * (K - 1);                      ssm d_inner * d_state
//   Mamba2: conv (d_inner + 2 * n_groups * d_state) * (K - 1);  ssm n_heads * head_dim * d_state
//           with d_inner = n_heads * head_dim; n_groups not divisible by tp is replicated
//           (vLLM extra_groups_for_head_shards): one group per rank
//   GDN:    conv (2 * Hk * Dk + Hv * Dv) * (K - 1);      ssm Hv * Dv * Dk
//   KDA:    conv (H * D + 2 * Hk * Dk) * (K - 1), Hk = H, Dk = D;  ssm H * D * D
//   Short convolution (LFM2): conv hidden_size * (K - 1), K = conv_L_cache;  no ssm
// Sources: ../shared/models/README.md (vLLM MambaStateShapeCalculator, SGLang mamba_utils).
#include "hybrid/families.h"

#include <algorithm>
#include <map>
#include <set>

#include "hybrid/family_builder.h"

namespace hybridkv::model_detail {
namespace {

using nlohmann::json;

// Nemotron-H's layer pattern: `hybrid_override_pattern` (M * - E), or the `layers_block_type`
// list that transformers 5 writes, as one pattern character per layer.
std::string nemotron_pattern(const Fields& f) {
  if (!f.has("hybrid_override_pattern") && f.has("layers_block_type")) {
    std::string pattern;
    for (const std::string& t :
         transformers_layer_types(f, "layers_block_type", {"mamba", "attention", "mlp", "moe"})) {
      pattern += t == "mamba" ? 'M' : t == "attention" ? '*' : t == "mlp" ? '-' : 'E';
    }
    return pattern;
  }
  const std::string pattern = f.string("hybrid_override_pattern");
  if (pattern.empty()) f.fail("hybrid_override_pattern", "is empty");
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != 'M' && c != '*' && c != '-' && c != 'E') {
      f.fail("hybrid_override_pattern", "character '" + std::string(1, c) + "' at " +
                                            std::to_string(i) + " is not one of M * - E");
    }
  }
  return pattern;
}

void read_nemotron_h(const Fields& f, ModelDescription& out, Builder& b) {
  const std::string pattern = nemotron_pattern(f);
  check_layer_count(f, pattern.size());
  const char* head_key = f.has("head_dim") ? "head_dim" : "attention_head_dim";
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '*') {
      b.gqa(static_cast<uint32_t>(i), "num_key_value_heads", f.positive("num_key_value_heads"),
            f.positive(head_key), window_of(f));
    } else if (c == 'M') {
      const uint64_t heads = f.positive("mamba_num_heads"), dim = f.positive("mamba_head_dim");
      // vLLM: intermediate_size = mamba_num_heads * mamba_head_dim (not expand * hidden_size).
      b.mamba2(static_cast<uint32_t>(i), "mamba_num_heads", heads, dim,
               f.positive("ssm_state_size"), "n_groups", f.positive("n_groups"),
               conv_kernel(f, "conv_kernel"), heads * dim);
    }
  }
  out.num_model_layers = static_cast<uint32_t>(pattern.size());
  out.family = "Mamba2";
}

void read_qwen3_next(const Fields& f, ModelDescription& out, Builder& b) {
  const uint64_t n = f.positive("num_hidden_layers");
  std::vector<std::string> types;
  if (f.has("layer_types")) {
    types = layer_types(f, "layer_types", {"full_attention", "linear_attention"});
    check_layer_count(f, types.size());
  } else {
    // transformers: full attention where (i + 1) % full_attention_interval == 0.
    const uint64_t interval = f.positive("full_attention_interval");
    for (uint64_t i = 0; i < n; ++i) {
      types.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
    }
  }
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "full_attention") {
      b.gqa(static_cast<uint32_t>(i), "num_key_value_heads", f.positive("num_key_value_heads"),
            f.positive("head_dim"), std::nullopt);
    } else {
      b.gdn(static_cast<uint32_t>(i), f.positive("linear_num_key_heads"),
            f.positive("linear_num_value_heads"), f.positive("linear_key_head_dim"),
            f.positive("linear_value_head_dim"), conv_kernel(f, "linear_conv_kernel_dim"));
    }
  }
  out.num_model_layers = static_cast<uint32_t>(types.size());
  out.family = "GDN";
}

void read_jamba(const Fields& f, ModelDescription& out, Builder& b) {
  const uint64_t n = f.positive("num_hidden_layers");
  const uint64_t period = f.positive("attn_layer_period");
  const uint64_t offset = f.non_negative("attn_layer_offset");
  if (offset >= period) {
    f.fail("attn_layer_offset",
           std::to_string(offset) + " must be < attn_layer_period " + std::to_string(period));
  }
  const uint64_t hidden = f.positive("hidden_size"), heads = f.positive("num_attention_heads");
  if (hidden % heads != 0) {
    f.fail("hidden_size", std::to_string(hidden) + " is not divisible by num_attention_heads " +
                              std::to_string(heads));
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (i % period == offset) {
      b.gqa(static_cast<uint32_t>(i), "num_key_value_heads", f.positive("num_key_value_heads"),
            hidden / heads, window_of(f));
    } else {
      b.mamba1(static_cast<uint32_t>(i), f.positive("mamba_expand") * hidden,
               f.positive("mamba_d_state"), conv_kernel(f, "mamba_d_conv"));
    }
  }
  out.num_model_layers = static_cast<uint32_t>(n);
  out.family = "Mamba1";
}

// A list of layer indices below n at `key` (Falcon-H1's and Bamba's attn_layer_indices,
// LFM2's full_attn_idxs); empty when null or absent.
std::set<uint64_t> layer_indices(const Fields& f, const char* key, uint64_t n) {
  std::set<uint64_t> out;
  if (!f.has(key)) return out;
  const json& list = f.array(key);
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_number_unsigned() || list[i].get<uint64_t>() >= n) {
      f.fail(std::string(key) + "[" + std::to_string(i) + "]",
             show(list[i]) + " is not a layer index below num_hidden_layers " + std::to_string(n));
    }
    out.insert(list[i].get<uint64_t>());
  }
  return out;
}

void read_falcon_h1(const Fields& f, ModelDescription& out, Builder& b) {
  const uint64_t n = f.positive("num_hidden_layers");
  const bool all = !f.has("attn_layer_indices");
  const std::set<uint64_t> attention = layer_indices(f, "attn_layer_indices", n);
  const uint64_t d_ssm = f.has("mamba_d_ssm")
                             ? f.positive("mamba_d_ssm")
                             : f.positive("mamba_expand") * f.positive("hidden_size");
  for (uint64_t i = 0; i < n; ++i) {
    // Parallel hybrid: attention and Mamba2 side by side become two cache layers.
    if (all || attention.count(i)) {
      b.gqa(static_cast<uint32_t>(i), "num_key_value_heads", f.positive("num_key_value_heads"),
            f.positive("head_dim"), std::nullopt);
    }
    b.mamba2(static_cast<uint32_t>(i), "mamba_n_heads", f.positive("mamba_n_heads"),
             f.positive("mamba_d_head"), f.positive("mamba_d_state"), "mamba_n_groups",
             f.positive("mamba_n_groups"), conv_kernel(f, "mamba_d_conv"), d_ssm);
  }
  out.num_model_layers = static_cast<uint32_t>(n);
  out.family = "Mamba2 (parallel)";
}

// Mamba2 and attention layers by type ("attention" / "mamba"), Granite-4.0-H's field names.
void read_granite_layers(const Fields& f, const std::vector<std::string>& types,
                         ModelDescription& out, Builder& b) {
  const uint64_t hidden = f.positive("hidden_size"), heads = f.positive("num_attention_heads");
  const uint64_t head_dim = f.has("head_dim") ? f.positive("head_dim") : hidden / heads;
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "attention") {
      b.gqa(static_cast<uint32_t>(i), "num_key_value_heads", f.positive("num_key_value_heads"),
            head_dim, std::nullopt);
    } else {
      const uint64_t mh = f.positive("mamba_n_heads"), md = f.positive("mamba_d_head");
      b.mamba2(static_cast<uint32_t>(i), "mamba_n_heads", mh, md, f.positive("mamba_d_state"),
               "mamba_n_groups", f.positive("mamba_n_groups"), conv_kernel(f, "mamba_d_conv"),
               mh * md);
    }
  }
  out.num_model_layers = static_cast<uint32_t>(types.size());
  out.family = "Mamba2";
}

void read_granite(const Fields& f, ModelDescription& out, Builder& b) {
  const std::vector<std::string> types =
      transformers_layer_types(f, "layer_types", {"attention", "mamba"});
  check_layer_count(f, types.size());
  read_granite_layers(f, types, out, b);
}

// Bamba: Granite's layers and fields, attention at attn_layer_indices (null: none). vLLM:
// intermediate_size = mamba_n_heads * mamba_d_head.
void read_bamba(const Fields& f, ModelDescription& out, Builder& b) {
  const uint64_t n = f.positive("num_hidden_layers");
  std::vector<std::string> types(n, "mamba");
  for (uint64_t i : layer_indices(f, "attn_layer_indices", n)) types[i] = "attention";
  read_granite_layers(f, types, out, b);
}

// Kimi-Linear's checkpoints: `linear_attn_config` (KDA heads, head_dim, kernel; 1-based
// full_attn_layers). transformers 5 writes the same as layer_types and linear_* fields.
struct KdaLayout {
  std::vector<bool> full;  // per layer: MLA attention (else KDA)
  const char* heads_key;
  uint64_t heads, head_dim, conv_kernel;
};

KdaLayout kimi_layout(const Fields& f, uint64_t n) {
  if (!f.has("linear_attn_config")) {
    const std::vector<std::string> types =
        layer_types(f, "layer_types", {"full_attention", "linear_attention"});
    check_layer_count(f, types.size());
    KdaLayout out{{},
                  "linear_num_heads",
                  f.positive("linear_num_heads"),
                  f.positive("linear_head_dim"),
                  conv_kernel(f, "linear_conv_kernel_dim")};
    for (const std::string& t : types) out.full.push_back(t == "full_attention");
    return out;
  }
  const Fields lac = f.object("linear_attn_config");
  std::vector<bool> full(n, false);
  const json& list = lac.array("full_attn_layers");
  for (size_t i = 0; i < list.size(); ++i) {
    // Published 1-based.
    if (!list[i].is_number_unsigned() || list[i].get<uint64_t>() < 1 ||
        list[i].get<uint64_t>() > n) {
      lac.fail("full_attn_layers[" + std::to_string(i) + "]",
               show(list[i]) + " is not a 1-based layer number in [1, " + std::to_string(n) + "]");
    }
    full[list[i].get<uint64_t>() - 1] = true;
  }
  return {std::move(full), "linear_attn_config.num_heads", lac.positive("num_heads"),
          lac.positive("head_dim"), conv_kernel(lac, "short_conv_kernel_size")};
}

void read_kimi_linear(const Fields& f, ModelDescription& out, Builder& b) {
  const KdaLayout layout = kimi_layout(f, f.positive("num_hidden_layers"));
  const uint64_t latent = f.positive("kv_lora_rank") + f.positive("qk_rope_head_dim");
  for (size_t i = 0; i < layout.full.size(); ++i) {
    if (layout.full[i]) {
      b.mla(static_cast<uint32_t>(i), latent);  // one replicated latent head, never split by TP
    } else {
      b.kda(static_cast<uint32_t>(i), layout.heads_key, layout.heads, layout.head_dim,
            layout.conv_kernel);
    }
  }
  out.num_model_layers = static_cast<uint32_t>(layout.full.size());
  out.family = "KDA + MLA";
}

void read_zamba2(const Fields& f, ModelDescription& out, Builder& b) {
  // transformers 5 writes linear_attention for the Mamba2 layers.
  const std::vector<std::string> types =
      transformers_layer_types(f, "layers_block_type", {"hybrid", "mamba"});
  check_layer_count(f, types.size());
  const uint64_t d_inner = f.positive("mamba_expand") * f.positive("hidden_size");
  for (size_t i = 0; i < types.size(); ++i) {
    // Hybrid layers run a shared transformer block but keep their own KV cache.
    if (types[i] == "hybrid") {
      b.gqa(static_cast<uint32_t>(i), "num_key_value_heads", f.positive("num_key_value_heads"),
            f.positive("attention_head_dim"), std::nullopt);
    }
    b.mamba2(static_cast<uint32_t>(i), "n_mamba_heads", f.positive("n_mamba_heads"),
             f.positive("mamba_headdim"), f.positive("mamba_d_state"), "mamba_ngroups",
             f.positive("mamba_ngroups"), conv_kernel(f, "mamba_d_conv"), d_inner);
  }
  out.num_model_layers = static_cast<uint32_t>(types.size());
  out.family = "Mamba2 + shared attention";
}

void read_mamba2(const Fields& f, ModelDescription& out, Builder& b) {
  const uint64_t n = f.positive("num_hidden_layers");
  const uint64_t heads = f.positive("num_heads"), dim = f.positive("head_dim");
  for (uint64_t i = 0; i < n; ++i) {
    b.mamba2(static_cast<uint32_t>(i), "num_heads", heads, dim, f.positive("state_size"),
             "n_groups", f.positive("n_groups"), conv_kernel(f, "conv_kernel"), heads * dim);
  }
  out.num_model_layers = static_cast<uint32_t>(n);
  out.family = "Mamba2";
}

// Pure Mamba1 (mamba, falcon_mamba): every layer a Mamba1 mixer of intermediate_size channels.
void read_mamba(const Fields& f, ModelDescription& out, Builder& b) {
  const uint64_t n = f.positive("num_hidden_layers");
  const uint64_t d_inner = f.has("intermediate_size")
                               ? f.positive("intermediate_size")
                               : f.positive("expand") * f.positive("hidden_size");
  for (uint64_t i = 0; i < n; ++i) {
    b.mamba1(static_cast<uint32_t>(i), d_inner, f.positive("state_size"),
             conv_kernel(f, "conv_kernel"));
  }
  out.num_model_layers = static_cast<uint32_t>(n);
  out.family = "Mamba1";
}

void read_dense(const Fields& f, const std::string& model_type, ModelDescription& out, Builder& b) {
  const uint64_t hidden = f.positive("hidden_size"), heads = f.positive("num_attention_heads");
  const uint64_t head_dim = f.has("head_dim") ? f.positive("head_dim") : hidden / heads;
  const uint64_t kv = f.has("num_key_value_heads") ? f.positive("num_key_value_heads") : heads;
  const char* kv_key = f.has("num_key_value_heads") ? "num_key_value_heads" : "num_attention_heads";
  std::vector<std::string> types;
  if (f.has("layer_types")) {
    types = layer_types(f, "layer_types", {"full_attention", "sliding_attention"});
    check_layer_count(f, types.size());
  } else {
    const uint64_t n = f.positive("num_hidden_layers");
    const bool sliding =
        (model_type == "mistral" || f.has("use_sliding_window")) && f.has("sliding_window");
    types.assign(n, sliding ? "sliding_attention" : "full_attention");
  }
  for (size_t i = 0; i < types.size(); ++i) {
    std::optional<uint32_t> window;
    if (types[i] == "sliding_attention") {
      window = window_of(f);
      if (!window) f.fail("sliding_window", "must be set for sliding_attention layers");
    }
    b.gqa(static_cast<uint32_t>(i), kv_key, kv, head_dim, window);
  }
  out.num_model_layers = static_cast<uint32_t>(types.size());
  out.family = "attention";
}

// LFM2: gated short convolutions ("conv") and full attention, by layer_types (or
// full_attn_idxs when layer_types is absent).
void read_lfm2(const Fields& f, ModelDescription& out, Builder& b) {
  const uint64_t n = f.positive("num_hidden_layers");
  std::vector<std::string> types;
  if (f.has("layer_types")) {
    types = layer_types(f, "layer_types", {"conv", "full_attention"});
    check_layer_count(f, types.size());
  } else {
    types.assign(n, "conv");
    if (!f.has("full_attn_idxs")) f.fail("full_attn_idxs", "is missing (and so is layer_types)");
    for (uint64_t i : layer_indices(f, "full_attn_idxs", n)) types[i] = "full_attention";
  }
  const uint64_t hidden = f.positive("hidden_size"), heads = f.positive("num_attention_heads");
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "full_attention") {
      b.gqa(static_cast<uint32_t>(i), "num_key_value_heads", f.positive("num_key_value_heads"),
            hidden / heads, std::nullopt);
    } else {
      b.short_conv(static_cast<uint32_t>(i), "hidden_size", hidden, conv_kernel(f, "conv_L_cache"));
    }
  }
  out.num_model_layers = static_cast<uint32_t>(types.size());
  out.family = "short conv";
}

// Multimodal wrappers whose cache layers are those of their text_config.
const std::set<std::string>& wrapper_types() {
  static const std::set<std::string> kTypes = {"qwen3_5", "qwen3_5_moe", "gemma3"};
  return kTypes;
}

using Reader = void (*)(const Fields&, const std::string& model_type, ModelDescription&, Builder&);

template <void (*Read)(const Fields&, ModelDescription&, Builder&)>
void any_type(const Fields& f, const std::string&, ModelDescription& out, Builder& b) {
  Read(f, out, b);
}

// Every model_type read here (besides the wrappers) and the function that reads its layers.
const std::map<std::string, Reader>& readers() {
  static const std::map<std::string, Reader> kReaders = [] {
    std::map<std::string, Reader> m;
    auto add = [&m](std::initializer_list<const char*> types, Reader read) {
      for (const char* t : types) m[t] = read;
    };
    add({"nemotron_h"}, any_type<read_nemotron_h>);
    // Gated delta net + full attention (Qwen3-Next's layout and field names).
    add({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid"},
        any_type<read_qwen3_next>);
    add({"jamba"}, any_type<read_jamba>);
    add({"falcon_h1"}, any_type<read_falcon_h1>);
    add({"granitemoehybrid"}, any_type<read_granite>);
    add({"bamba"}, any_type<read_bamba>);
    add({"lfm2", "lfm2_moe"}, any_type<read_lfm2>);
    add({"kimi_linear"}, any_type<read_kimi_linear>);
    add({"zamba2"}, any_type<read_zamba2>);
    add({"mamba2"}, any_type<read_mamba2>);
    add({"mamba", "falcon_mamba"}, any_type<read_mamba>);
    // Attention only, full or sliding window per layer (layer_types).
    add({"mistral",     "llama",   "qwen2",       "qwen3",
         "gemma3_text", "gpt_oss", "gemma2",      "cohere2",
         "exaone4",     "olmo3",   "granite_swa", "ministral",
         "vaultgemma",  "afmoe",   "cohere2_moe", "cohere_compass_text",
         "cwm",         "dots1",   "exaone_moe",  "granitemoe_swa",
         "laguna",      "mellum"},
        read_dense);
    return m;
  }();
  return kReaders;
}

}  // namespace

const std::string& known_model_types() {
  static const std::string kNames = [] {
    std::set<std::string> names(wrapper_types());
    for (const auto& [name, read] : readers()) names.insert(name);
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
    return out;
  }();
  return kNames;
}

void read_family(const Fields& f, const std::string& model_type, const ModelOptions& options,
                 ModelDescription& out) {
  if (wrapper_types().count(model_type)) {
    const Fields text = f.object("text_config");
    const std::string text_type =
        text.has("model_type") ? text.string("model_type") : model_type + "_text";
    if (wrapper_types().count(text_type)) text.fail("model_type", "'" + text_type + "' nests");
    return read_family(text, text_type, options, out);
  }
  const auto it = readers().find(model_type);
  if (it == readers().end()) {
    f.fail("model_type", "'" + model_type + "' is unknown (known: " + known_model_types() + ")");
  }
  Builder b(f, options, out);
  it->second(f, model_type, out, b);
}

}  // namespace hybridkv::model_detail
