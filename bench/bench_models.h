// The layers of a bundled model as a ManagerConfig without tiers, for the benchmarks.
#pragma once

#include <cstdlib>
#include <string>

#include "hybridkv/model.h"

namespace hybridkv {

inline ManagerConfig model_config(const char* file, uint32_t tokens_per_block) {
  Result<ModelDescription> m =
      read_model_config(std::string(HKV_MODELS_DIR) + "/" + file, ModelOptions{});
  if (!m) std::abort();
  ManagerConfig c;
  c.tokens_per_block = tokens_per_block;
  c.attention_layers = m->attention_layer_configs(tokens_per_block);
  c.ssm_layers = m->ssm_layer_configs();
  return c;
}

}  // namespace hybridkv
