// Request traces for `hybridkv sim`: the Mooncake JSONL format and a synthetic generator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridkv/status.h"

namespace hybridkv::tools {

// One request: lengths and block ids only. Its tokens are expanded when it is admitted
// (prompt_tokens, output_tokens), so that a trace of a million requests costs its ids, not its
// tokens.
struct TraceRequest {
  uint64_t index = 0;  // position in the trace (seeds its unique tokens)
  uint64_t timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;  // one per 512-token block of the prompt (Mooncake)
};

constexpr uint64_t kMooncakeBlock = 512;

// Id h gives 512 tokens no other id shares (a partial last block is a prefix of them).
std::vector<int32_t> prompt_tokens(const TraceRequest& request);
// Generated tokens, unique to the request.
std::vector<int32_t> output_tokens(const TraceRequest& request);

// Reads a Mooncake JSONL trace (at most `limit` requests; 0 = all). Errors name the file and
// line; a request must list exactly ceil(input_length / 512) hash ids.
Result<std::vector<TraceRequest>> read_mooncake_trace(const std::string& path, uint64_t limit);

// Synthetic traffic: multi-turn chats (each turn's prompt is the conversation so far) and agents
// that share a system prompt. `spec` is "synthetic:N[:seed]", or "synthetic:SHAPE:N[:seed]" for
// one named shape of traffic (kTraceShapes); `limit` (0: none) keeps the first requests of it.
Result<std::vector<TraceRequest>> synthetic_trace(const std::string& spec, uint64_t limit);

// The named shapes (trace_shapes.cc): many users' multi-turn chats; a few shared system prompts
// before many users' questions; agents whose context grows by tool outputs; few-shot prompts
// sharing examples in different orders; retrieval with shared documents at different offsets.
inline constexpr const char* kTraceShapes[] = {"chat", "system", "agent", "fewshot", "rag"};
// `shape` one of kTraceShapes, `rest` "N[:seed]" (spec names the whole, for errors).
Result<std::vector<TraceRequest>> shaped_trace(const std::string& spec, const std::string& shape,
                                               const std::string& rest, uint64_t limit);
// Gives a synthetic request its position and ids for the blocks it lists none for (its own).
void pad_ids(TraceRequest& r, uint64_t index, uint64_t unique_base);

// Writes the trace as Mooncake JSONL (timestamp, input_length, output_length, hash_ids), so that a
// synthetic trace can be replayed or checked by other tools.
Status write_mooncake_trace(const std::vector<TraceRequest>& trace, const std::string& path);

// The reuse bound of DESIGN/traces README: for each request, the longest token prefix shared
// with any earlier prompt, capped at input_length - 1; summed.
// Per request, in trace order (the sum is the bound).
std::vector<uint64_t> reuse_bound(const std::vector<TraceRequest>& trace);

}  // namespace hybridkv::tools
