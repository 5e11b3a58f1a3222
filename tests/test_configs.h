// Configurations shared by the plan tests.
#pragma once

#include "hybridkv/config.h"

namespace hybridkv::testing {

// The hand-computed example of the plan tests (tokens_per_block 16, util 0.95):
//   layer 0: SSM, REQUIRED: ssm_state 4096 B, conv_state 1024 B, replay_row 16 B (PRIVATE)
//   layer 1: full attention: key 2048 B, value 2048 B
//   layer 2: window 32: key 1024 B, value 1024 B
//   layer 3: window 32 + 4 sink tokens: key 1024 B, value 1024 B
inline ManagerConfig example_config() {
  ManagerConfig c;
  c.tokens_per_block = 16;
  c.max_util_for_resume = 0.95;
  SsmLayerConfig ssm;
  ssm.id = 0;
  ssm.buffers = {{"ssm_state", 4096, {}, DType::kF32},
                 {"conv_state", 1024, {}, DType::kBF16},
                 {"replay_row", 16, ReusePolicy::kPrivate, {}}};
  c.ssm_layers.push_back(ssm);
  AttentionLayerConfig full;
  full.id = 1;
  full.buffers = {{"key", 2048, {}, DType::kBF16}, {"value", 2048, {}, DType::kBF16}};
  AttentionLayerConfig window = full;
  window.id = 2;
  window.window = 32;
  window.buffers = {{"key", 1024, {}, {}}, {"value", 1024, {}, {}}};
  AttentionLayerConfig sinks = window;
  sinks.id = 3;
  sinks.sink_tokens = 4;
  c.attention_layers = {full, window, sinks};
  c.tiers.push_back({TierKind::kGpu, 2ull << 20, ""});
  return c;
}

}  // namespace hybridkv::testing
