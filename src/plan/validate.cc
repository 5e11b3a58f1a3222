// Configuration validation: every error, each naming the field and the value.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "hybridkv/config.h"
#include "plan/plan_internal.h"
#include "util/errors.h"

namespace hybridkv {
namespace {

constexpr uint32_t kMaxTokensPerBlock = 1u << 16;
constexpr uint64_t kMaxPageBytes = 1ull << 40;  // 1 TiB per page is surely a unit mistake
constexpr uint64_t kMaxTokens = 1ull << 40;

// Keeps the first kListedErrors messages and counts the rest (a config of a million bad layers
// costs a counter, not a million strings).
class Errors {
 public:
  template <typename... Args>
  void add(const Args&... args) {
    if (++count_ > kListedErrors) return;
    std::ostringstream os;
    (os << ... << args);
    list_.push_back(os.str());
  }
  std::vector<std::string> take() {
    if (count_ > kListedErrors) list_.push_back(more_errors(count_));
    return std::move(list_);
  }

 private:
  std::vector<std::string> list_;
  size_t count_ = 0;
};

std::string layer_label(const char* list, size_t index, LayerId id) {
  return std::string(list) + "[" + std::to_string(index) + "] (layer " + std::to_string(id) + ")";
}

bool valid_role(const std::string& role) {
  if (role.empty() || role.size() > 64) return false;
  for (char c : role) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

void check_buffers(const std::string& label, const std::vector<BufferConfig>& buffers,
                   Errors& errors) {
  if (buffers.empty()) errors.add(label, ": buffers must not be empty");
  std::set<std::string> roles;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferConfig& b = buffers[i];
    const std::string at = label + ".buffers[" + std::to_string(i) + "]";
    if (!valid_role(b.role)) {
      errors.add(at, ": role '", b.role,
                 "' must be 1-64 characters of letters, digits, '_', '.' or '-'");
    } else if (!roles.insert(b.role).second) {
      errors.add(at, ": role '", b.role, "' appears twice in the layer");
    }
    if (b.bytes_per_page > kMaxPageBytes) {
      errors.add(at, " (", b.role, "): bytes_per_page ", b.bytes_per_page, " exceeds ",
                 kMaxPageBytes);
    }
    if (b.dtype && b.bytes_per_page % dtype_size(*b.dtype) != 0) {
      errors.add(at, " (", b.role, "): bytes_per_page ", b.bytes_per_page,
                 " is not a multiple of the ", dtype_name(*b.dtype), " element size ",
                 dtype_size(*b.dtype));
    }
  }
}

void check_batch(const std::string& label, const BatchShape& batch, Errors& errors) {
  if (batch.requests.empty()) errors.add(label, ": requests must not be empty");
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    const RequestShape& r = batch.requests[i];
    const std::string at = label + ".requests[" + std::to_string(i) + "]";
    // capacity 0 is a state-only request (a recurrent layer's state and no KV yet).
    if (r.capacity > kMaxTokens) errors.add(at, ": capacity ", r.capacity, " exceeds ", kMaxTokens);
    if (r.history > r.capacity) {
      errors.add(at, ": history ", r.history, " must be <= capacity ", r.capacity);
    }
    if (batch.shared_prefix_tokens && *batch.shared_prefix_tokens > r.capacity) {
      errors.add(label, ".shared_prefix_tokens ", *batch.shared_prefix_tokens, " exceeds requests[",
                 i, "].capacity ", r.capacity);
      break;
    }
  }
  if (batch.shared_prefix_tokens && *batch.shared_prefix_tokens == 0) {
    errors.add(label, ".shared_prefix_tokens 0 must be > 0 or unset");
  }
}

void check_layers(const ManagerConfig& c, Errors& errors) {
  std::map<LayerId, std::string> seen;
  auto note_id = [&](const std::string& label, LayerId id) {
    if (id < 0) errors.add(label, ": id ", id, " must be >= 0");
    auto [it, inserted] = seen.emplace(id, label);
    if (!inserted) errors.add(label, ": id ", id, " is already used by ", it->second);
  };
  for (size_t i = 0; i < c.attention_layers.size(); ++i) {
    const AttentionLayerConfig& l = c.attention_layers[i];
    const std::string label = layer_label("attention_layers", i, l.id);
    note_id(label, l.id);
    if (l.window && *l.window == 0) errors.add(label, ": window 0 must be > 0 or unset");
    if (l.sink_tokens) {
      if (*l.sink_tokens == 0) errors.add(label, ": sink_tokens 0 must be > 0 or unset");
      if (!l.window) {
        errors.add(label, ": sink_tokens ", *l.sink_tokens,
                   " needs a window (sinks only matter to sliding-window layers)");
      } else if (*l.sink_tokens > *l.window) {
        errors.add(label, ": sink_tokens ", *l.sink_tokens, " must be <= window ", *l.window);
      }
    }
    check_buffers(label, l.buffers, errors);
  }
  for (size_t i = 0; i < c.ssm_layers.size(); ++i) {
    const SsmLayerConfig& l = c.ssm_layers[i];
    const std::string label = layer_label("ssm_layers", i, l.id);
    note_id(label, l.id);
    check_buffers(label, l.buffers, errors);
  }
}

void check_tiers(const ManagerConfig& c, Errors& errors) {
  if (c.tiers.empty()) errors.add("tiers must not be empty: a GPU tier is required");
  std::set<TierKind> kinds;
  for (size_t i = 0; i < c.tiers.size(); ++i) {
    const TierConfig& t = c.tiers[i];
    const std::string at = "tiers[" + std::to_string(i) + "] (" + tier_kind_name(t.kind) + ")";
    if (static_cast<uint8_t>(t.kind) > static_cast<uint8_t>(TierKind::kDisk)) {
      errors.add("tiers[", i, "]: kind ", static_cast<int>(t.kind), " is not GPU, HOST or DISK");
      continue;
    }
    if (!kinds.insert(t.kind).second) errors.add(at, ": tier kind appears twice");
    if (i == 0 && t.kind != TierKind::kGpu) errors.add(at, ": the first tier must be GPU");
    if (i > 0 && static_cast<uint8_t>(t.kind) <= static_cast<uint8_t>(c.tiers[i - 1].kind)) {
      errors.add(at, ": tiers must be ordered GPU, HOST, DISK");
    }
    if (t.quota_bytes == 0) errors.add(at, ": quota_bytes 0 must be > 0");
    if (t.max_quota_bytes != 0 && t.max_quota_bytes < t.quota_bytes) {
      errors.add(at, ": max_quota_bytes ", t.max_quota_bytes, " is below quota_bytes ",
                 t.quota_bytes);
    }
    if (t.max_quota_bytes > plan_detail::kMaxQuotaBytes) {
      errors.add(at, ": max_quota_bytes ", t.max_quota_bytes, " exceeds ",
                 plan_detail::kMaxQuotaBytes);
    }
    if (t.quota_bytes > plan_detail::kMaxQuotaBytes) {
      errors.add(at, ": quota_bytes ", t.quota_bytes, " exceeds ", plan_detail::kMaxQuotaBytes);
    }
    if (t.kind == TierKind::kDisk && t.path.empty()) errors.add(at, ": path must be set for DISK");
    if (t.kind != TierKind::kDisk && !t.path.empty()) {
      errors.add(at, ": path '", t.path, "' is only meaningful for DISK");
    }
  }
}

void check_knobs(const ManagerConfig& c, Errors& errors) {
  if (!(c.max_util_for_resume > 0.0 && c.max_util_for_resume <= 1.0)) {
    errors.add("max_util_for_resume ", c.max_util_for_resume, " must be in (0, 1]");
  }
  if (c.max_live_kv_caches && *c.max_live_kv_caches == 0) {
    errors.add("max_live_kv_caches 0 must be > 0 or unset");
  }
  if (c.tokens_per_block > 0 && c.reuse_match_backoff > kMaxTokens) {
    errors.add("reuse_match_backoff ", c.reuse_match_backoff, " exceeds ", kMaxTokens);
  }
  if (c.pool_ratio) {
    if (c.pool_ratio->empty()) errors.add("pool_ratio must not be empty when set");
    for (size_t i = 0; i < c.pool_ratio->size(); ++i) {
      const double r = (*c.pool_ratio)[i];
      if (!(std::isfinite(r) && r > 0.0)) {
        errors.add("pool_ratio[", i, "] ", r, " must be finite and > 0");
      }
    }
  }
  if (c.snapshot_dtype && *c.snapshot_dtype != DType::kBF16 &&
      *c.snapshot_dtype != DType::kFP8E4M3) {
    errors.add("snapshot_dtype ", dtype_name(*c.snapshot_dtype),
               " is not supported (reduced-precision snapshots are bf16 or fp8_e4m3)");
  }
  if (c.max_rewind_len < 0) errors.add("max_rewind_len ", c.max_rewind_len, " must be >= 0");
  if (c.max_rewind_len > static_cast<int64_t>(kMaxTokens)) {
    errors.add("max_rewind_len ", c.max_rewind_len, " exceeds ", kMaxTokens);
  }
  const bool windows = std::any_of(c.attention_layers.begin(), c.attention_layers.end(),
                                   [](const AttentionLayerConfig& l) { return l.window; });
  if (c.swa_scratch_reuse && !windows) {
    errors.add("swa_scratch_reuse is on but no attention layer has a sliding window");
  }
  if (c.typical_step) check_batch("typical_step", *c.typical_step, errors);
  for (size_t i = 0; i < c.constraints.size(); ++i) {
    const std::string label = "constraints[" + std::to_string(i) + "]";
    check_batch(label, c.constraints[i], errors);
    if (c.max_live_kv_caches && c.constraints[i].requests.size() > *c.max_live_kv_caches) {
      errors.add(label, ": ", c.constraints[i].requests.size(),
                 " requests exceed max_live_kv_caches ", *c.max_live_kv_caches);
    }
  }
}

}  // namespace

static void check_shared(const SharedTierConfig& s, Errors& errors) {
  if (s.store == nullptr) return;
  if (s.model_id.empty())
    errors.add("shared.model_id must name the model when shared.store is set");
  if (s.max_lookup_blocks == 0) errors.add("shared.max_lookup_blocks 0 must be > 0");
  if (s.max_queued_objects == 0) errors.add("shared.max_queued_objects 0 must be > 0");
  if (s.max_queued_bytes == 0) errors.add("shared.max_queued_bytes 0 must be > 0");
  if (!(s.prefill_tokens_per_s >= 0)) {
    errors.add("shared.prefill_tokens_per_s ", s.prefill_tokens_per_s, " must be >= 0");
  }
  if (!(s.fetch_bytes_per_s > 0)) {
    errors.add("shared.fetch_bytes_per_s ", s.fetch_bytes_per_s, " must be > 0");
  }
}

std::vector<std::string> config_errors(const ManagerConfig& c) {
  Errors errors;
  if (c.tokens_per_block == 0) {
    errors.add("tokens_per_block 0 must be > 0");
  } else if (c.tokens_per_block > kMaxTokensPerBlock) {
    errors.add("tokens_per_block ", c.tokens_per_block, " exceeds ", kMaxTokensPerBlock);
  }
  if (c.attention_layers.empty() && c.ssm_layers.empty()) {
    errors.add("attention_layers and ssm_layers are both empty: the model has no cache layers");
  }
  check_layers(c, errors);
  check_tiers(c, errors);
  check_knobs(c, errors);
  check_shared(c.shared, errors);
  return errors.take();
}

Status validate_config(const ManagerConfig& config) {
  const std::vector<std::string> errors = config_errors(config);
  if (errors.empty()) return Status::ok();
  std::string message;  // at most kListedErrors + 1 entries (Errors)
  for (const std::string& e : errors) message += (message.empty() ? "" : "; ") + e;
  return Status::invalid(message);
}

}  // namespace hybridkv
