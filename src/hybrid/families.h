// Per-family readers of HuggingFace configs (internal to model_config.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "hybridkv/model.h"

namespace hybridkv::model_detail {

// Thrown inside the reader only; parse_model_config turns it into a Status.
struct ReadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Typed access to config fields; every failure names the field and the value.
class Fields {
 public:
  Fields(const nlohmann::json& object, std::string scope) : j_(object), scope_(std::move(scope)) {}

  bool has(const char* key) const;                                   // present and not null
  uint64_t positive(const char* key) const;                          // required integer > 0
  uint64_t non_negative(const char* key) const;                      // required integer >= 0
  std::optional<uint64_t> optional_positive(const char* key) const;  // null/absent -> nullopt
  std::string string(const char* key) const;
  std::optional<std::string> optional_string(const char* key) const;
  const nlohmann::json& array(const char* key) const;  // required array
  Fields object(const char* key) const;                // required object
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;
  std::string field(const std::string& key) const;  // "field 'key'" or "field 'scope.key'"

 private:
  const nlohmann::json& j_;
  std::string scope_;
};

// A JSON value shortened for a message (at most 60 characters).
std::string show(const nlohmann::json& v);

// Fills out.layers, out.family and out.num_model_layers for out.model_type.
void read_family(const Fields& f, const std::string& model_type, const ModelOptions& options,
                 ModelDescription& out);

// The names read_family knows, for the "unknown model_type" message.
const std::string& known_model_types();

}  // namespace hybridkv::model_detail
