// Serving settings -> the manager config of one pipeline rank, with replay buffers per family.
//
// Replay buffers, per recurrent layer and request (S = num_spec_tokens; bf16 = 2 B, fp32 = 4 B;
// "2 x" is the double buffer the verify kernels flip between; sizes are per TP rank):
//   Mamba2 (PRIVATE):  replay_old_x         2 x S x n_heads x head_dim x bf16
//                      replay_old_B         2 x S x n_groups x d_state x bf16
//                      replay_old_dt        2 x S x n_heads x fp32
//                      replay_old_dA_cumsum 2 x S x n_heads x fp32
//   GDN, Triton (PRIVATE): replay_old_x 2 x S x Hv x Dv x bf16, replay_old_B 2 x S x Hk x Dk x
//   bf16,
//                      replay_old_dt 2 x S x Hv x fp32 (no dA cumsum)
//   GDN, ring (coupled REQUIRED): replay_k_ring S x Hk x Dk x bf16, replay_u_ring S x Hv x Dv x
//   bf16,
//                      replay_g_ring S x Hv x fp32
//   KDA (PRIVATE):     replay_conv (conv windows) conv_dim x S x conv dtype,
//                      replay_records (per-draft records) 3 x S x H x K x fp32
//   Mamba1:            none (no speculative replay)
// plus one 16-byte replay_meta row per request (accepted count, active buffer) on the rank's
// first recurrent layer. Roles and double buffering follow ../shared/seeds/000 and 001.
#include <algorithm>

#include "hybridkv/hybrid.h"
#include "hybridkv/units.h"
#include "plan/plan_internal.h"
#include "util/errors.h"

namespace hybridkv {

const char* replay_layout_name(ReplayLayout layout) {
  return layout == ReplayLayout::kRing ? "ring" : "private";
}

uint64_t max_live_caches(const ServingConfig& s) {
  const uint64_t doubling = (s.overlap_scheduling || s.role != DisaggRole::kBoth) ? 2 : 1;
  return static_cast<uint64_t>(s.max_batch) * s.pp_size * doubling + s.dummy_slots + 1;
}

namespace {

void add_replay(const ModelLayer& l, const ServingConfig& s, const ModelDescription& m, bool first,
                SsmLayerConfig& layer) {
  const uint64_t S = s.num_spec_tokens;
  const RecurrentShape& sh = l.shape;
  const std::optional<ReusePolicy> policy = s.replay_layout == ReplayLayout::kRing
                                                ? std::nullopt
                                                : std::optional<ReusePolicy>(ReusePolicy::kPrivate);
  auto add = [&](const char* role, uint64_t bytes, DType dtype) {
    layer.buffers.push_back({role, bytes, policy, dtype});
  };
  switch (l.mixer) {
    case MixerKind::kMamba2:
      add("replay_old_x", 2 * S * sh.num_heads * sh.head_dim * 2, DType::kBF16);
      add("replay_old_B", 2 * S * sh.n_groups * sh.state_size * 2, DType::kBF16);
      add("replay_old_dt", 2 * S * sh.num_heads * 4, DType::kF32);
      add("replay_old_dA_cumsum", 2 * S * sh.num_heads * 4, DType::kF32);
      break;
    case MixerKind::kGdn:
      if (s.replay_layout == ReplayLayout::kRing) {
        add("replay_k_ring", S * sh.n_groups * sh.state_size * 2, DType::kBF16);
        add("replay_u_ring", S * sh.num_heads * sh.head_dim * 2, DType::kBF16);
        add("replay_g_ring", S * sh.num_heads * 4, DType::kF32);
      } else {
        add("replay_old_x", 2 * S * sh.num_heads * sh.head_dim * 2, DType::kBF16);
        add("replay_old_B", 2 * S * sh.n_groups * sh.state_size * 2, DType::kBF16);
        add("replay_old_dt", 2 * S * sh.num_heads * 4, DType::kF32);
      }
      break;
    case MixerKind::kKda:
      add("replay_conv", sh.conv_dim * S * dtype_size(m.conv_dtype), m.conv_dtype);
      add("replay_records", 3 * S * sh.num_heads * sh.head_dim * 4, DType::kF32);
      break;
    default:
      return;  // Mamba1: no replay
  }
  if (first) add("replay_meta", 16, DType::kUINT8);
}

// Errors of the serving settings against the model, joined; OK when there are none.
Status check_serving(const ModelDescription& model, const ServingConfig& s) {
  std::vector<std::string> errors;
  if (s.max_batch == 0) errors.push_back("max_batch 0 must be > 0");
  if (s.max_seq_len && *s.max_seq_len == 0) errors.push_back("max_seq_len 0 must be > 0 or unset");
  if (s.pp_size == 0) errors.push_back("pp_size 0 must be > 0");
  if (s.pp_size > 0 && s.pp_rank >= s.pp_size) {
    errors.push_back("pp_rank " + std::to_string(s.pp_rank) + " must be < pp_size " +
                     std::to_string(s.pp_size));
  }
  if (s.pp_size > model.num_model_layers && model.num_model_layers > 0) {
    errors.push_back("pp_size " + std::to_string(s.pp_size) + " exceeds the model's " +
                     std::to_string(model.num_model_layers) + " layers");
  }
  if (s.snapshots.periodic_interval == uint64_t{0}) {
    errors.push_back("snapshots.periodic_interval 0 must be > 0 or unset");
  }
  if (s.snapshots.aligned_end == uint64_t{0}) {
    errors.push_back("snapshots.aligned_end 0 must be > 0 or unset");
  }
  if (s.num_spec_tokens > 64) {
    errors.push_back("num_spec_tokens " + std::to_string(s.num_spec_tokens) + " exceeds 64");
  }
  const bool has_gdn = std::any_of(model.layers.begin(), model.layers.end(),
                                   [](const ModelLayer& l) { return l.mixer == MixerKind::kGdn; });
  if (s.replay_layout == ReplayLayout::kRing && !has_gdn) {
    errors.push_back("replay_layout ring is only for GDN models; " + model.model_type +
                     " keeps replay state PRIVATE");
  }
  return errors.empty() ? Status::ok() : Status::invalid(join_errors(errors));
}

// This rank's contiguous share of the base layers (with replay buffers where the family has
// them); MTP layers go to the last rank.
void add_rank_layers(const ModelDescription& model, const ServingConfig& s, ManagerConfig& c) {
  const uint32_t L = model.num_model_layers;
  const uint32_t begin = static_cast<uint32_t>(static_cast<uint64_t>(L) * s.pp_rank / s.pp_size);
  const uint32_t end =
      static_cast<uint32_t>(static_cast<uint64_t>(L) * (s.pp_rank + 1) / s.pp_size);
  const uint32_t tpb = s.tokens_per_block == 0 ? 1 : s.tokens_per_block;
  const std::vector<AttentionLayerConfig> attention = model.attention_layer_configs(tpb);
  const std::vector<SsmLayerConfig> ssm = model.ssm_layer_configs();
  size_t ai = 0, si = 0;
  bool first_recurrent = true;
  const bool replay = s.num_spec_tokens > 0 && s.role != DisaggRole::kContext;
  for (const ModelLayer& l : model.layers) {
    const bool mine = l.model_layer >= begin && l.model_layer < end;
    if (l.is_attention()) {
      if (mine) c.attention_layers.push_back(attention[ai]);
      ++ai;
    } else {
      if (mine) {
        SsmLayerConfig layer = ssm[si];
        if (replay) add_replay(l, s, model, first_recurrent, layer);
        first_recurrent = false;
        c.ssm_layers.push_back(std::move(layer));
      }
      ++si;
    }
  }
  const uint32_t mtp = s.mtp_layers.value_or(model.num_mtp_layers);
  if (s.pp_rank + 1 == s.pp_size && mtp > 0 && !attention.empty()) {
    // MTP layers: attention layers with the model's attention shape, after every base layer.
    LayerId next = static_cast<LayerId>(model.layers.size());
    for (uint32_t i = 0; i < mtp; ++i) {
      AttentionLayerConfig a = attention.front();
      a.id = next++;
      a.window.reset();
      c.attention_layers.push_back(std::move(a));
    }
  }
}

// Every living cache holds at least one page of every buffer (a KV block, a state). Batches
// beyond what any GPU could hold are refused before anything is sized for them (a huge
// max_batch would otherwise build a typical step of that many requests): more than
// kMaxLiveCaches living caches on one rank, or more bytes than the largest quota accepted.
Status check_live_caches_fit(const ServingConfig& s, const ManagerConfig& c) {
  constexpr uint64_t kMaxLiveCaches = 1ull << 20;
  uint64_t per_request = 0;
  for (const AttentionLayerConfig& l : c.attention_layers) {
    for (const BufferConfig& b : l.buffers) per_request += b.bytes_per_page;
  }
  for (const SsmLayerConfig& l : c.ssm_layers) {
    for (const BufferConfig& b : l.buffers) per_request += b.bytes_per_page;
  }
  const uint64_t live = max_live_caches(s);
  const bool too_many = live > kMaxLiveCaches;
  const bool too_big = per_request > 0 && live > plan_detail::kMaxQuotaBytes / per_request;
  if (!too_many && !too_big) return Status::ok();
  return Status::invalid(
      "max_batch " + std::to_string(s.max_batch) + " and dummy_slots " +
      std::to_string(s.dummy_slots) + " give " + std::to_string(live) +
      " living caches on this rank: beyond what any GPU quota could hold (at most " +
      std::to_string(kMaxLiveCaches) + " living caches are planned for, and each holds at least " +
      "one KV block and one state, " + format_bytes(per_request) + ")");
}

}  // namespace

Result<ManagerConfig> hybrid_manager_config(const ModelDescription& model, const ServingConfig& s) {
  if (Status v = check_serving(model, s); !v) return v;
  ManagerConfig c;
  c.tokens_per_block = s.tokens_per_block;
  const uint32_t tpb = s.tokens_per_block == 0 ? 1 : s.tokens_per_block;
  add_rank_layers(model, s, c);
  if (Status v = check_live_caches_fit(s, c); !v) return v;
  c.tiers = s.tiers;
  c.max_util_for_resume = s.max_util_for_resume;
  c.max_live_kv_caches = static_cast<uint32_t>(max_live_caches(s));
  c.enable_block_reuse = s.enable_block_reuse;
  c.enable_partial_reuse = s.enable_partial_reuse;
  c.policies = s.policies;
  c.snapshot_dtype = s.snapshot_dtype;
  c.record_events = s.record_events;
  c.shared = s.shared;
  c.commit_min_snapshot = true;  // snapshot points need not be block-aligned
  c.typical_step =
      BatchShape{std::vector<RequestShape>(s.max_batch,
                                           {s.typical_len, s.typical_len ? s.typical_len - 1 : 0}),
                 {}};
  // A state slot for every request of a full batch (every pipeline micro-batch) and every dummy,
  // all ACTIVE at once: capacity-0 requests reserve exactly their states.
  const uint64_t active = static_cast<uint64_t>(s.max_batch) * s.pp_size + s.dummy_slots;
  c.constraints.push_back(BatchShape{std::vector<RequestShape>(active, RequestShape{0, 0}), {}});
  if (s.max_seq_len && *s.max_seq_len > 0)
    c.constraints.push_back(BatchShape{{RequestShape{*s.max_seq_len, *s.max_seq_len - 1}}, {}});
  if (s.dummy_slots > 0) {
    // Dummies stay ACTIVE with a block each: they and one real request always fit on the GPU.
    std::vector<RequestShape> batch(s.dummy_slots, RequestShape{tpb, 0});
    batch.push_back({tpb, 0});
    c.constraints.push_back(BatchShape{std::move(batch), {}});
  }
  if (Status v = validate_config(c); !v) return v;
  return c;
}

}  // namespace hybridkv
