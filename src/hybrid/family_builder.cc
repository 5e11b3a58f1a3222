// Builder and the field readers the family readers share (family_builder.h).
#include "hybrid/family_builder.h"

namespace hybridkv::model_detail {

using nlohmann::json;

uint64_t split(const Fields& f, const char* what, uint64_t count, uint32_t tp) {
  if (count % tp != 0) {
    f.fail(what, std::to_string(count) + " is not divisible by tp " + std::to_string(tp));
  }
  return count / tp;
}

uint64_t kv_heads_per_rank(const Fields& f, const char* what, uint64_t heads, uint32_t tp) {
  if (heads >= tp) return split(f, what, heads, tp);
  if (tp % heads != 0) {
    f.fail(what, std::to_string(heads) + " heads cannot be replicated evenly over tp " +
                     std::to_string(tp));
  }
  return 1;
}

std::optional<uint32_t> window_of(const Fields& f) {
  std::optional<uint64_t> w = f.optional_positive("sliding_window");
  if (w && *w > UINT32_MAX) f.fail("sliding_window", std::to_string(*w) + " is too large");
  return w ? std::optional<uint32_t>(static_cast<uint32_t>(*w)) : std::nullopt;
}

uint64_t conv_kernel(const Fields& f, const char* key) {
  const uint64_t k = f.positive(key);
  if (k < 2) f.fail(key, std::to_string(k) + " must be >= 2 (the conv state keeps K - 1 columns)");
  return k;
}

std::vector<std::string> layer_types(const Fields& f, const char* key,
                                     const std::set<std::string>& allowed) {
  std::vector<std::string> out;
  const json& list = f.array(key);
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string() || !allowed.count(list[i].get<std::string>())) {
      std::string names;
      for (const std::string& a : allowed) names += (names.empty() ? "" : ", ") + a;
      f.fail(std::string(key) + "[" + std::to_string(i) + "]",
             show(list[i]) + " is not one of " + names);
    }
    out.push_back(list[i].get<std::string>());
  }
  if (out.empty()) f.fail(key, "is empty");
  return out;
}

std::vector<std::string> transformers_layer_types(const Fields& f, const char* key,
                                                  std::set<std::string> allowed) {
  static const std::pair<const char*, const char*> kAliases[] = {{"full_attention", "attention"},
                                                                 {"linear_attention", "mamba"}};
  for (const auto& [alias, name] : kAliases)
    if (allowed.count(name)) allowed.insert(alias);
  std::vector<std::string> types = layer_types(f, key, allowed);
  for (std::string& t : types)
    for (const auto& [alias, name] : kAliases)
      if (t == alias) t = name;
  return types;
}

void check_layer_count(const Fields& f, size_t listed) {
  if (f.has("num_hidden_layers") && f.positive("num_hidden_layers") != listed) {
    f.fail("num_hidden_layers", std::to_string(f.positive("num_hidden_layers")) +
                                    " does not match the " + std::to_string(listed) +
                                    " layers listed");
  }
}

}  // namespace hybridkv::model_detail
