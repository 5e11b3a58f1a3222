// Reading HuggingFace config.json files into ModelDescriptions.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hybrid/families.h"
#include "hybridkv/model.h"

namespace hybridkv {
namespace model_detail {
namespace {

using nlohmann::json;

// Every count in a config is far below this; larger values are typos or mutations and would
// overflow the byte products.
constexpr uint64_t kMaxField = 1ull << 20;

}  // namespace

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string Fields::field(const std::string& key) const {
  return "field '" + (scope_.empty() ? key : scope_ + "." + key) + "'";
}

void Fields::fail(const std::string& key, const std::string& problem) const {
  throw ReadError(field(key) + ": " + problem);
}

bool Fields::has(const char* key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

uint64_t Fields::non_negative(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) fail(key, "is missing");
  if (!it->is_number_integer() ||
      (it->is_number_integer() && it->get<int64_t>() < 0 && !it->is_number_unsigned())) {
    fail(key, show(*it) + " must be a non-negative integer");
  }
  const uint64_t v = it->get<uint64_t>();
  if (v > kMaxField) fail(key, std::to_string(v) + " is larger than " + std::to_string(kMaxField));
  return v;
}

uint64_t Fields::positive(const char* key) const {
  const uint64_t v = non_negative(key);
  if (v == 0) fail(key, "0 must be > 0");
  return v;
}

std::optional<uint64_t> Fields::optional_positive(const char* key) const {
  if (!has(key)) return std::nullopt;
  return positive(key);
}

std::string Fields::string(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) fail(key, "is missing");
  if (!it->is_string()) fail(key, show(*it) + " must be a string");
  return it->get<std::string>();
}

std::optional<std::string> Fields::optional_string(const char* key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

const json& Fields::array(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) fail(key, "is missing");
  if (!it->is_array()) fail(key, show(*it) + " must be an array");
  return *it;
}

Fields Fields::object(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) fail(key, "is missing");
  if (!it->is_object()) fail(key, show(*it) + " must be an object");
  return Fields(*it, scope_.empty() ? key : scope_ + "." + key);
}

}  // namespace model_detail

const char* mixer_kind_name(MixerKind kind) {
  switch (kind) {
    case MixerKind::kAttention:
      return "attention";
    case MixerKind::kMla:
      return "mla";
    case MixerKind::kMamba1:
      return "mamba1";
    case MixerKind::kMamba2:
      return "mamba2";
    case MixerKind::kGdn:
      return "gdn";
    case MixerKind::kKda:
      return "kda";
    case MixerKind::kShortConv:
      return "short_conv";
  }
  return "?";
}

Result<ModelDescription> parse_model_config(std::string_view json_text, const ModelOptions& options,
                                            std::string_view source) {
  const std::string where(source);
  if (options.tp_size == 0) return Status::invalid(where + ": tp 0 must be > 0");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalid(where + ": malformed JSON at byte " + std::to_string(e.byte) + ": " +
                           e.what());
  } catch (const nlohmann::json::exception& e) {  // e.g. a number beyond double's range
    return Status::invalid(where + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) return Status::invalid(where + ": the top level must be a JSON object");
  ModelDescription out;
  out.source = where;
  out.tp_size = options.tp_size;
  out.kv_dtype = options.kv_dtype;
  out.conv_dtype = options.conv_dtype;
  try {
    const model_detail::Fields f(j, "");
    out.model_type = f.string("model_type");
    if (f.has("max_position_embeddings")) {
      const nlohmann::json& m = j["max_position_embeddings"];
      if (m.is_number_unsigned() && m.get<uint64_t>() > 0)
        out.max_position_embeddings = m.get<uint64_t>();
    }
    if (options.ssm_dtype) {
      out.ssm_dtype = *options.ssm_dtype;
    } else {
      out.ssm_dtype = DType::kF32;
      for (const char* key : {"mamba_ssm_cache_dtype", "mamba_ssm_dtype"}) {
        if (!f.has(key)) continue;
        const std::string name = f.string(key);
        const std::optional<DType> d = parse_dtype(name);
        if (!d) f.fail(key, "'" + name + "' is not a known dtype");
        out.ssm_dtype = *d;
      }
    }
    // The checkpoint dtype: not what the cache stores (options.kv_dtype says that), but a
    // misspelt one is a broken config and is refused rather than ignored.
    for (const char* key : {"torch_dtype", "dtype"}) {
      if (!f.has(key) || j[key].is_null()) continue;
      const std::string name = f.string(key);
      if (name != "auto" && !parse_dtype(name)) {
        f.fail(key, "'" + name +
                        "' is not a dtype hybridkv knows (float32, float16, bfloat16, "
                        "float8_e4m3fn, float8_e5m2, int8, auto)");
      }
    }
    if (f.has("num_nextn_predict_layers")) {
      out.num_mtp_layers = static_cast<uint32_t>(f.non_negative("num_nextn_predict_layers"));
    }
    model_detail::read_family(f, out.model_type, options, out);
  } catch (const model_detail::ReadError& e) {
    return Status::invalid(where + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid(where + ": " + e.what());
  }
  if (out.layers.empty()) {
    return Status::invalid(where + ": the model has no attention or recurrent layers");
  }
  return out;
}

Result<ModelDescription> read_model_config(const std::string& path, const ModelOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::invalid(path + ": is a directory; give the model's config.json (e.g. " +
                           (std::filesystem::path(path) / "config.json").string() + ")");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, path + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status(StatusCode::kIoError, path + ": read failed");
  return parse_model_config(text.str(), options, path);
}

uint64_t ModelDescription::full_kv_bytes_per_token() const {
  uint64_t total = 0;
  for (const ModelLayer& l : layers) {
    if (l.is_attention() && !l.window) total += l.kv_elements_per_token * dtype_size(kv_dtype);
  }
  return total;
}

uint64_t ModelDescription::sliding_kv_bytes_per_token() const {
  uint64_t total = 0;
  for (const ModelLayer& l : layers) {
    if (l.is_attention() && l.window) total += l.kv_elements_per_token * dtype_size(kv_dtype);
  }
  return total;
}

uint64_t ModelDescription::kv_bytes_per_token() const {
  return full_kv_bytes_per_token() + sliding_kv_bytes_per_token();
}

uint64_t ModelDescription::ssm_bytes_per_sequence() const {
  uint64_t total = 0;
  for (const ModelLayer& l : layers) total += l.ssm_elements * dtype_size(ssm_dtype);
  return total;
}

uint64_t ModelDescription::conv_bytes_per_sequence() const {
  uint64_t total = 0;
  for (const ModelLayer& l : layers) total += l.conv_elements * dtype_size(conv_dtype);
  return total;
}

uint64_t ModelDescription::state_bytes_per_sequence() const {
  return ssm_bytes_per_sequence() + conv_bytes_per_sequence();
}

size_t ModelDescription::num_attention_layers() const {
  size_t n = 0;
  for (const ModelLayer& l : layers) n += l.is_attention() ? 1 : 0;
  return n;
}

size_t ModelDescription::num_recurrent_layers() const {
  return layers.size() - num_attention_layers();
}

std::vector<AttentionLayerConfig> ModelDescription::attention_layer_configs(
    uint32_t tokens_per_block) const {
  std::vector<AttentionLayerConfig> out;
  const uint64_t elem = dtype_size(kv_dtype);
  for (const ModelLayer& l : layers) {
    if (!l.is_attention()) continue;
    AttentionLayerConfig a;
    a.id = l.cache_layer;
    a.window = l.window;
    if (l.mixer == MixerKind::kMla) {
      a.buffers.push_back({"mla_latent", l.head_dim * elem * tokens_per_block, {}, kv_dtype});
    } else {
      const uint64_t bytes = l.kv_heads * l.head_dim * elem * tokens_per_block;
      a.buffers.push_back({"key", bytes, {}, kv_dtype});
      a.buffers.push_back({"value", bytes, {}, kv_dtype});
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<SsmLayerConfig> ModelDescription::ssm_layer_configs() const {
  std::vector<SsmLayerConfig> out;
  for (const ModelLayer& l : layers) {
    if (l.is_attention()) continue;
    SsmLayerConfig s;
    s.id = l.cache_layer;
    if (l.ssm_elements > 0)  // a short convolution keeps a conv state only
      s.buffers.push_back({"ssm_state", l.ssm_elements * dtype_size(ssm_dtype), {}, ssm_dtype});
    s.buffers.push_back({"conv_state", l.conv_elements * dtype_size(conv_dtype), {}, conv_dtype});
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace hybridkv
