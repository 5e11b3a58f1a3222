// Request traces for `hybridkv sim`: the Mooncake JSONL format and a synthetic generator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridkv/status.h"

namespace hybridkv::tools {

struct TraceRequest {
  uint64_t timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;  // one per 512-token block of the prompt (Mooncake)
  std::vector<int32_t> prompt;     // expanded tokens
  std::vector<int32_t> output;     // generated tokens, unique to the request
};

constexpr uint64_t kMooncakeBlock = 512;

// Reads a Mooncake JSONL trace (at most `limit` requests; 0 = all) and expands hash ids into
// tokens: id h gives 512 tokens no other id shares (a partial last block is a prefix of them);
// outputs are tokens unique to the request. Errors name the file and line.
Result<std::vector<TraceRequest>> read_mooncake_trace(const std::string& path, uint64_t limit);

// Synthetic traffic: multi-turn chats (each turn's prompt is the conversation so far) and agents
// that share a system prompt. `spec` is "synthetic:N[:seed]".
Result<std::vector<TraceRequest>> synthetic_trace(const std::string& spec);

// Writes the trace as Mooncake JSONL (timestamp, input_length, output_length, hash_ids), so that a
// synthetic trace can be replayed or checked by other tools.
Status write_mooncake_trace(const std::vector<TraceRequest>& trace, const std::string& path);

// The reuse bound of DESIGN/traces README: for each request, the longest token prefix shared
// with any earlier prompt, capped at input_length - 1; summed.
uint64_t reuse_bound(const std::vector<TraceRequest>& trace);

}  // namespace hybridkv::tools
