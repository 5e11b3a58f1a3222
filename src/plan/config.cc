#include <algorithm>
#include <cctype>
#include <string>

#include "hybridkv/config.h"

namespace hybridkv {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

const char* reuse_policy_name(ReusePolicy policy) {
  switch (policy) {
    case ReusePolicy::kRequired:
      return "REQUIRED";
    case ReusePolicy::kOptional:
      return "OPTIONAL";
    case ReusePolicy::kPrivate:
      return "PRIVATE";
  }
  return "?";
}

std::optional<ReusePolicy> parse_reuse_policy(std::string_view text) {
  const std::string t = lower(text);
  if (t == "required") return ReusePolicy::kRequired;
  if (t == "optional") return ReusePolicy::kOptional;
  if (t == "private") return ReusePolicy::kPrivate;
  return std::nullopt;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kFP8E5M2:
      return "fp8_e5m2";
    case DType::kINT8:
      return "int8";
    case DType::kUINT8:
      return "uint8";
  }
  return "?";
}

uint32_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kINT8:
    case DType::kUINT8:
      return 1;
  }
  return 1;
}

std::optional<DType> parse_dtype(std::string_view text) {
  const std::string t = lower(text);
  if (t == "fp32" || t == "float32" || t == "float") return DType::kF32;
  if (t == "fp16" || t == "float16" || t == "half") return DType::kF16;
  if (t == "bf16" || t == "bfloat16") return DType::kBF16;
  if (t == "fp8_e4m3" || t == "fp8" || t == "float8_e4m3fn" || t == "e4m3") return DType::kFP8E4M3;
  if (t == "fp8_e5m2" || t == "float8_e5m2" || t == "e5m2") return DType::kFP8E5M2;
  if (t == "int8") return DType::kINT8;
  if (t == "uint8") return DType::kUINT8;
  return std::nullopt;
}

const char* tier_kind_name(TierKind kind) {
  switch (kind) {
    case TierKind::kGpu:
      return "GPU";
    case TierKind::kHost:
      return "HOST";
    case TierKind::kDisk:
      return "DISK";
  }
  return "?";
}

BatchShape default_typical_step() {
  BatchShape step;
  step.requests.assign(32, RequestShape{2048, 2047});
  return step;
}

}  // namespace hybridkv
