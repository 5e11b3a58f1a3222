// Rendering of a storage plan for people (text) and programs (JSON).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridkv/model.h"
#include "hybridkv/plan.h"

namespace hybridkv::tools {

nlohmann::json plan_to_json(const ModelDescription& model, const StoragePlan& plan);
std::string plan_to_text(const ModelDescription& model, const StoragePlan& plan);

// What one rank holds (issue 34 item 4): every tensor-parallel rank of a pipeline rank holds
// the same, so a layout is one row per pipeline rank.
struct RankBytes {
  uint32_t pp_rank = 0;
  uint64_t attention_layers = 0;
  uint64_t recurrent_layers = 0;
  uint64_t kv_bytes_per_token = 0;        // every attention layer of the rank
  uint64_t state_bytes_per_sequence = 0;  // every recurrent layer's state and conv buffers
  uint64_t gpu_bytes = 0;                 // the GPU tier's pools
  uint64_t host_bytes = 0;                // the HOST tier's pools
};
RankBytes rank_bytes(uint32_t pp_rank, const StoragePlan& plan);
// The rows, then the whole layout (tp x pp ranks).
std::string ranks_to_text(const std::vector<RankBytes>& ranks, uint32_t tp);
nlohmann::json ranks_to_json(const std::vector<RankBytes>& ranks, uint32_t tp);

}  // namespace hybridkv::tools
