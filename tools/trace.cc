#include "trace.h"

#include "hybridkv/testing/mix.h"
#include "hybridkv/units.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

namespace hybridkv::tools {
namespace {

uint64_t mix(uint64_t x) { return mix64(x); }

// Prompt tokens live below 2^30, generated ones above: the two never collide. Within each,
// (id, position) -> token is a counter-mode hash; a collision between two ids' 512-token blocks
// would need all 512 tokens to agree.
int32_t prompt_token(uint64_t id, uint64_t i) {
  return static_cast<int32_t>(mix(id * kMooncakeBlock + i) & ((1u << 30) - 1));
}
int32_t output_token(uint64_t request, uint64_t i) {
  return static_cast<int32_t>((1u << 30) |
                              (mix(request * 0x100000001b3ull + i) & ((1u << 30) - 1)));
}

uint64_t blocks_of(const TraceRequest& r) {
  return (r.input_length + kMooncakeBlock - 1) / kMooncakeBlock;
}

}  // namespace

void pad_ids(TraceRequest& r, uint64_t index, uint64_t unique_base) {
  r.index = index;
  while (r.hash_ids.size() < blocks_of(r))
    r.hash_ids.push_back(unique_base + index * 4096 + r.hash_ids.size());
}

std::vector<int32_t> prompt_tokens(const TraceRequest& r) {
  std::vector<int32_t> prompt;
  prompt.reserve(r.input_length);
  for (uint64_t b = 0; prompt.size() < r.input_length; ++b) {
    for (uint64_t i = 0; i < kMooncakeBlock && prompt.size() < r.input_length; ++i)
      prompt.push_back(prompt_token(r.hash_ids[b], i));
  }
  return prompt;
}

std::vector<int32_t> output_tokens(const TraceRequest& r) {
  std::vector<int32_t> output;
  output.reserve(r.output_length);
  for (uint64_t i = 0; i < r.output_length; ++i) output.push_back(output_token(r.index, i));
  return output;
}

Result<std::vector<TraceRequest>> read_mooncake_trace(const std::string& path, uint64_t limit) {
  std::ifstream in(path);
  if (!in) return Status(StatusCode::kNotFound, path + ": cannot open the trace");
  std::vector<TraceRequest> out;
  std::string line;
  uint64_t line_no = 0;
  auto fail = [&](const std::string& problem) {
    return Status::invalid(path + " line " + std::to_string(line_no) + ": " + problem);
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
    TraceRequest r;
    for (const char* key : {"timestamp", "input_length", "output_length"}) {
      if (!j.contains(key)) return fail(std::string("field '") + key + "' is missing");
      const auto& v = j[key];
      if (!v.is_number_integer() ||
          (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
        return fail(std::string("field '") + key + "' is " + v.dump() +
                    ", not a non-negative integer");
      }
    }
    r.timestamp_ms = j["timestamp"].get<uint64_t>();
    r.input_length = j["input_length"].get<uint64_t>();
    r.output_length = j["output_length"].get<uint64_t>();
    if (r.input_length == 0)
      return fail("field 'input_length' is 0; a prompt has at least one token");
    if (r.input_length > (1u << 24) || r.output_length > (1u << 24))
      return fail("lengths above 2^24");
    if (!j.contains("hash_ids") || !j["hash_ids"].is_array())
      return fail("field 'hash_ids' is missing or not an array");
    for (const auto& h : j["hash_ids"]) {
      if (!h.is_number_unsigned())
        return fail("hash_ids holds " + h.dump() + ", not a non-negative integer");
      r.hash_ids.push_back(h.get<uint64_t>());
    }
    if (r.hash_ids.size() != blocks_of(r)) {
      return fail("hash_ids holds " + std::to_string(r.hash_ids.size()) + " ids but input_length " +
                  std::to_string(r.input_length) + " needs " + std::to_string(blocks_of(r)) +
                  " (one per 512-token block)");
    }
    r.index = out.size();
    out.push_back(std::move(r));
    if (limit && out.size() >= limit) break;
  }
  if (out.empty()) return Status::invalid(path + ": the trace holds no requests");
  return out;
}

Result<std::vector<TraceRequest>> synthetic_trace(const std::string& spec, uint64_t limit) {
  // synthetic:SHAPE:N[:seed] (trace_shapes.cc), or synthetic:N[:seed]: the mixed traffic below.
  const size_t shape_end = spec.find(':', 10);
  const std::string shape =
      spec.substr(10, shape_end == std::string::npos ? spec.npos : shape_end - 10);
  if (!shape.empty() && std::isalpha(static_cast<unsigned char>(shape[0]))) {
    return shaped_trace(spec, shape,
                        shape_end == std::string::npos ? "" : spec.substr(shape_end + 1), limit);
  }
  const size_t a = spec.find(':'), b = spec.find(':', a + 1);
  const Result<uint64_t> count =
      parse_count(spec.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1));
  const Result<uint64_t> seed_value =
      b == std::string::npos ? Result<uint64_t>(uint64_t{1}) : parse_count(spec.substr(b + 1));
  for (const Result<uint64_t>* r : {&count, &seed_value}) {
    if (!*r) {
      return Status::invalid(
          "--trace " + spec + ": " + r->status().message() +
          " (expected synthetic:N, synthetic:N:SEED or synthetic:SHAPE:N[:SEED])");
    }
  }
  uint64_t n = *count;
  const uint64_t seed = *seed_value;
  if (n == 0 || n > 1'000'000)
    return Status::invalid("--trace " + spec + ": N must be in [1, 1000000]");
  if (limit > 0) n = std::min(n, limit);
  std::mt19937_64 rng(seed);
  std::vector<TraceRequest> out;
  uint64_t next_id = 1ull << 41, t = 0;
  std::vector<std::vector<uint64_t>> systems(4);
  for (auto& s : systems) {
    for (int i = 0; i < 4; ++i) s.push_back(next_id++);
  }
  while (out.size() < n) {
    // A conversation: an agent's system prompt (shared), then turns that extend it.
    std::vector<uint64_t> ids = systems[rng() % systems.size()];
    const int turns = 1 + static_cast<int>(rng() % 4);
    for (int turn = 0; turn < turns && out.size() < n; ++turn) {
      const int user_blocks = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < user_blocks; ++i) ids.push_back(next_id++);
      TraceRequest r;
      r.timestamp_ms = t;
      t += 50 + rng() % 200;
      r.hash_ids = ids;
      r.input_length = ids.size() * kMooncakeBlock - rng() % kMooncakeBlock;
      r.output_length = 20 + rng() % 200;
      out.push_back(std::move(r));
      ids.push_back(next_id++);  // the answer becomes part of the next turn
    }
  }
  for (uint64_t i = 0; i < out.size(); ++i) pad_ids(out[i], i, 1ull << 42);
  return out;
}

Status write_mooncake_trace(const std::vector<TraceRequest>& trace, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status(StatusCode::kIoError, "cannot write '" + path + "'");
  for (const TraceRequest& r : trace) {
    nlohmann::json j;
    j["timestamp"] = r.timestamp_ms;
    j["input_length"] = r.input_length;
    j["output_length"] = r.output_length;
    j["hash_ids"] = r.hash_ids;
    out << j.dump() << "\n";
  }
  if (!out) return Status(StatusCode::kIoError, "writing '" + path + "' failed");
  return Status::ok();
}

std::vector<uint64_t> reuse_bound(const std::vector<TraceRequest>& trace) {
  // A trie over hash-id paths; each node keeps the most tokens any earlier prompt had in it.
  struct Node {
    std::map<uint64_t, uint32_t> children;
    uint64_t tokens = 0;
  };
  std::vector<Node> nodes(1);
  std::vector<uint64_t> bound;
  bound.reserve(trace.size());
  for (const TraceRequest& r : trace) {
    const uint64_t blocks = (r.input_length + kMooncakeBlock - 1) / kMooncakeBlock;
    uint64_t shared = 0;
    uint32_t at = 0;
    bool open = true;
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t id = r.hash_ids[b];
      const uint64_t mine = std::min(kMooncakeBlock, r.input_length - b * kMooncakeBlock);
      auto it = nodes[at].children.find(id);
      uint32_t child;
      if (it == nodes[at].children.end()) {
        child = static_cast<uint32_t>(nodes.size());
        nodes[at].children.emplace(id, child);
        nodes.emplace_back();
        open = false;
      } else {
        child = it->second;
        if (open) {
          const uint64_t common = std::min(nodes[child].tokens, mine);
          shared += common;
          if (common < kMooncakeBlock) open = false;
        }
      }
      nodes[child].tokens = std::max(nodes[child].tokens, mine);
      at = child;
    }
    bound.push_back(std::min(shared, r.input_length - 1));
  }
  return bound;
}

}  // namespace hybridkv::tools
