// The pieces every family reader of families.cc uses: a Builder that appends one cache layer
// per mixer (with the element counts of the formulas in families.cc), and the field readers
// shared by several families.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hybrid/families.h"

namespace hybridkv::model_detail {

// Splits `count` (heads, channels) across tp ranks.
uint64_t split(const Fields& f, const char* what, uint64_t count, uint32_t tp);
// KV heads: split, or replicated when there are fewer heads than ranks.
uint64_t kv_heads_per_rank(const Fields& f, const char* what, uint64_t heads, uint32_t tp);

// Appends the cache layers of one model, in order.
class Builder {
 public:
  Builder(const Fields& f, const ModelOptions& o, ModelDescription& out)
      : f_(f), o_(o), out_(out) {}

  void gqa(uint32_t model_layer, const char* heads_key, uint64_t kv_heads, uint64_t head_dim,
           std::optional<uint32_t> window) {
    ModelLayer l = next(model_layer, MixerKind::kAttention);
    l.kv_heads = kv_heads_per_rank(f_, heads_key, kv_heads, o_.tp_size);
    l.head_dim = head_dim;
    l.kv_elements_per_token = 2 * l.kv_heads * head_dim;
    l.window = window;
    out_.layers.push_back(l);
  }

  void mla(uint32_t model_layer, uint64_t latent) {
    ModelLayer l = next(model_layer, MixerKind::kMla);
    l.kv_heads = 1;
    l.head_dim = latent;
    l.kv_elements_per_token = latent;
    out_.layers.push_back(l);
  }

  void mamba2(uint32_t model_layer, const char* heads_key, uint64_t n_heads, uint64_t head_dim,
              uint64_t d_state, const char* groups_key, uint64_t n_groups, uint64_t conv_kernel,
              uint64_t d_inner) {
    const uint32_t tp = o_.tp_size;
    ModelLayer l = next(model_layer, MixerKind::kMamba2);
    RecurrentShape& s = l.shape;
    s.num_heads = split(f_, heads_key, n_heads, tp);
    s.head_dim = head_dim;
    s.state_size = d_state;
    if (n_groups % tp == 0) {
      s.n_groups = n_groups / tp;
    } else if (tp % n_groups == 0) {
      s.n_groups = 1;  // replicated so that every rank has the groups its heads use
    } else {
      f_.fail(groups_key, std::to_string(n_groups) + " groups cannot be split or replicated " +
                              "evenly over tp " + std::to_string(tp));
    }
    s.d_inner = split(f_, "d_inner", d_inner, tp);
    s.conv_dim = s.d_inner + 2 * s.n_groups * d_state;
    s.conv_kernel = conv_kernel;
    l.conv_elements = s.conv_dim * (conv_kernel - 1);
    l.ssm_elements = s.num_heads * head_dim * d_state;
    out_.layers.push_back(l);
  }

  void mamba1(uint32_t model_layer, uint64_t d_inner, uint64_t d_state, uint64_t conv_kernel) {
    ModelLayer l = next(model_layer, MixerKind::kMamba1);
    RecurrentShape& s = l.shape;
    s.d_inner = split(f_, "mamba_expand * hidden_size", d_inner, o_.tp_size);
    s.state_size = d_state;
    s.conv_dim = s.d_inner;
    s.conv_kernel = conv_kernel;
    l.conv_elements = s.d_inner * (conv_kernel - 1);
    l.ssm_elements = s.d_inner * d_state;
    out_.layers.push_back(l);
  }

  // A short convolution over `channels` (LFM2): conv channels * (K - 1), no SSM state.
  void short_conv(uint32_t model_layer, const char* channels_key, uint64_t channels,
                  uint64_t conv_kernel) {
    ModelLayer l = next(model_layer, MixerKind::kShortConv);
    RecurrentShape& s = l.shape;
    s.d_inner = split(f_, channels_key, channels, o_.tp_size);
    s.conv_dim = s.d_inner;
    s.conv_kernel = conv_kernel;
    l.conv_elements = s.d_inner * (conv_kernel - 1);
    out_.layers.push_back(l);
  }

  void gdn(uint32_t model_layer, uint64_t hk, uint64_t hv, uint64_t dk, uint64_t dv,
           uint64_t conv_kernel) {
    ModelLayer l = next(model_layer, MixerKind::kGdn);
    RecurrentShape& s = l.shape;
    const uint64_t hk_rank = split(f_, "linear_num_key_heads", hk, o_.tp_size);
    s.num_heads = split(f_, "linear_num_value_heads", hv, o_.tp_size);
    s.head_dim = dv;
    s.state_size = dk;
    s.n_groups = hk_rank;
    s.d_inner = s.num_heads * dv;
    s.conv_dim = 2 * hk_rank * dk + s.num_heads * dv;
    s.conv_kernel = conv_kernel;
    l.conv_elements = s.conv_dim * (conv_kernel - 1);
    l.ssm_elements = s.num_heads * dv * dk;
    out_.layers.push_back(l);
  }

  void kda(uint32_t model_layer, const char* heads_key, uint64_t heads, uint64_t head_dim,
           uint64_t conv_kernel) {
    ModelLayer l = next(model_layer, MixerKind::kKda);
    RecurrentShape& s = l.shape;
    s.num_heads = split(f_, heads_key, heads, o_.tp_size);
    s.head_dim = head_dim;
    s.state_size = head_dim;
    s.n_groups = s.num_heads;
    s.d_inner = s.num_heads * head_dim;
    s.conv_dim = 3 * s.num_heads * head_dim;  // H*D (v) + 2*Hk*Dk (q, k) with Hk = H, Dk = D
    s.conv_kernel = conv_kernel;
    l.conv_elements = s.conv_dim * (conv_kernel - 1);
    l.ssm_elements = s.num_heads * head_dim * head_dim;
    out_.layers.push_back(l);
  }

 private:
  ModelLayer next(uint32_t model_layer, MixerKind mixer) {
    ModelLayer l;
    l.cache_layer = static_cast<LayerId>(out_.layers.size());
    l.model_layer = model_layer;
    l.mixer = mixer;
    return l;
  }

  const Fields& f_;
  const ModelOptions& o_;
  ModelDescription& out_;
};

std::optional<uint32_t> window_of(const Fields& f);
uint64_t conv_kernel(const Fields& f, const char* key);
// A list of layer types, each checked against `allowed`.
std::vector<std::string> layer_types(const Fields& f, const char* key,
                                     const std::set<std::string>& allowed);
// A layer-type list that may also use the names transformers 5 writes for its caches
// (full_attention for attention, linear_attention for mamba): read as the family's own names.
std::vector<std::string> transformers_layer_types(const Fields& f, const char* key,
                                                  std::set<std::string> allowed);
// num_hidden_layers, where present, must equal the layers a list names.
void check_layer_count(const Fields& f, size_t listed);

}  // namespace hybridkv::model_detail
