// Named shapes of synthetic traffic (`--trace synthetic:SHAPE:N[:SEED]`), for judging reuse on
// traffic the defaults were not tuned on (issue 35). Each shape is a population of sessions
// (a user's chat, an agent's run) whose requests arrive over time; the sessions start as a
// Poisson process and interleave, so that many are open at once as on a serving instance.
// Prompts are Mooncake-style lists of 512-token block ids: an id shared between two prompts is
// shared content, a fresh id is content no other prompt has. Every prompt ends in a block of
// its own (the user's question, a tool's output), cut at a random length.
#include <algorithm>
#include <random>

#include "hybridkv/units.h"
#include "trace.h"

namespace hybridkv::tools {
namespace {

using Ids = std::vector<uint64_t>;

// One session's requests: (ms after the session starts, prompt ids).
using Session = std::vector<std::pair<uint64_t, Ids>>;

class Shapes {
 public:
  explicit Shapes(uint64_t seed) : rng_(seed) {}

  uint64_t between(uint64_t lo, uint64_t hi) { return lo + rng_() % (hi - lo + 1); }
  Ids fresh(uint64_t blocks) {
    Ids out;
    for (uint64_t i = 0; i < blocks; ++i) out.push_back(next_id_++);
    return out;
  }
  static void append(Ids& to, const Ids& more) { to.insert(to.end(), more.begin(), more.end()); }
  // An index in [0, n) drawn with weight 1 / (k + 1): a few popular items, a long tail.
  size_t popular(size_t n) {
    std::vector<double> w(n);
    for (size_t k = 0; k < n; ++k) w[k] = 1.0 / static_cast<double>(k + 1);
    return std::discrete_distribution<size_t>(w.begin(), w.end())(rng_);
  }

  // Many users, each a conversation of 2-12 turns: the prompt is the conversation so far (the
  // previous answer a block no prompt shares before it, then the new message).
  Session chat() {
    Session s;
    Ids ids;
    uint64_t at = 0;
    const uint64_t turns = between(2, 12);
    for (uint64_t t = 0; t < turns; ++t) {
      append(ids, fresh(between(1, 3)));
      s.emplace_back(at, ids);
      append(ids, fresh(1));  // the answer, part of the next turn's prompt
      at += between(3'000, 30'000);
    }
    return s;
  }

  // Eight system prompts of 2-16 blocks, some far more used than others, before each user's
  // question; one user in five asks a follow-up.
  Session system() {
    if (systems_.empty()) {
      for (int i = 0; i < 8; ++i) systems_.push_back(fresh(between(2, 16)));
    }
    Ids ids = systems_[popular(systems_.size())];
    append(ids, fresh(between(1, 2)));
    Session s{{0, ids}};
    if (rng_() % 5 == 0) {
      append(ids, fresh(2));  // the answer and the follow-up
      s.emplace_back(between(10'000, 40'000), ids);
    }
    return s;
  }

  // Agents of four kinds (a system prompt each) on their own tasks: 5-25 steps, each adding the
  // agent's action and a tool's output of 1-6 blocks to the context.
  Session agent() {
    if (systems_.empty()) {
      for (int i = 0; i < 4; ++i) systems_.push_back(fresh(between(4, 8)));
    }
    Ids ids = systems_[rng_() % systems_.size()];
    append(ids, fresh(between(1, 2)));  // the task
    Session s;
    uint64_t at = 0;
    const uint64_t steps = between(5, 25);
    for (uint64_t i = 0; i < steps; ++i) {
      s.emplace_back(at, ids);
      append(ids, fresh(1 + between(1, 6)));  // the action, then the tool's output
      at += between(1'000, 5'000);
    }
    return s;
  }

  // Six tasks, each an instruction and a pool of 16 one-block examples; a prompt is the
  // instruction, 4-8 of the examples in a random order, and the query.
  Session fewshot() {
    if (systems_.empty()) {
      for (int i = 0; i < 6; ++i) {
        systems_.push_back(fresh(between(1, 2)));
        pools_.push_back(fresh(16));
      }
    }
    const size_t task = rng_() % systems_.size();
    Ids ids = systems_[task];
    Ids examples = pools_[task];
    std::shuffle(examples.begin(), examples.end(), rng_);
    examples.resize(between(4, 8));
    append(ids, examples);
    append(ids, fresh(1));
    return {{0, ids}};
  }

  // Retrieval: one system prompt, then 3-5 of 300 documents (2-4 blocks each, some far more
  // often retrieved), in the order the retriever ranked them, then the question; three users
  // in ten ask a follow-up.
  Session rag() {
    if (systems_.empty()) {
      systems_.push_back(fresh(2));
      for (int i = 0; i < 300; ++i) pools_.push_back(fresh(between(2, 4)));
    }
    Ids ids = systems_[0];
    std::vector<size_t> docs;
    const uint64_t k = between(3, 5);
    while (docs.size() < k) {
      const size_t d = popular(pools_.size());
      if (std::find(docs.begin(), docs.end(), d) == docs.end()) docs.push_back(d);
    }
    for (size_t d : docs) append(ids, pools_[d]);
    append(ids, fresh(1));
    Session s{{0, ids}};
    if (rng_() % 10 < 3) {
      append(ids, fresh(2));
      s.emplace_back(between(10'000, 40'000), ids);
    }
    return s;
  }

  Session next(const std::string& shape) {
    if (shape == "chat") return chat();
    if (shape == "system") return system();
    if (shape == "agent") return agent();
    if (shape == "fewshot") return fewshot();
    return rag();
  }
  // Mean ms between two sessions' starts.
  static uint64_t session_gap(const std::string& shape) {
    if (shape == "chat") return 400;
    if (shape == "agent") return 2'000;
    return 120;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  uint64_t next_id_ = 1ull << 40;
  std::vector<Ids> systems_;
  std::vector<Ids> pools_;
};

}  // namespace

Result<std::vector<TraceRequest>> shaped_trace(const std::string& spec, const std::string& shape,
                                               const std::string& rest, uint64_t limit) {
  if (std::find_if(std::begin(kTraceShapes), std::end(kTraceShapes),
                   [&](const char* s) { return shape == s; }) == std::end(kTraceShapes)) {
    return Status::invalid("--trace " + spec + ": unknown shape '" + shape +
                           "' (chat, system, agent, fewshot or rag)");
  }
  const size_t colon = rest.find(':');
  const Result<uint64_t> count = parse_count(rest.substr(0, colon));
  const Result<uint64_t> seed = colon == std::string::npos ? Result<uint64_t>(uint64_t{1})
                                                           : parse_count(rest.substr(colon + 1));
  for (const Result<uint64_t>* r : {&count, &seed}) {
    if (!*r) {
      return Status::invalid("--trace " + spec + ": " + r->status().message() +
                             " (expected synthetic:" + shape + ":N or synthetic:" + shape +
                             ":N:SEED)");
    }
  }
  if (*count == 0 || *count > 1'000'000)
    return Status::invalid("--trace " + spec + ": N must be in [1, 1000000]");
  const uint64_t n = limit > 0 ? std::min(*count, limit) : *count;
  Shapes shapes(*seed);
  std::vector<TraceRequest> out;
  std::exponential_distribution<double> gap(1.0 / static_cast<double>(Shapes::session_gap(shape)));
  double start = 0;
  auto add_session = [&] {
    for (auto& [at, ids] : shapes.next(shape)) {
      TraceRequest r;
      r.timestamp_ms = static_cast<uint64_t>(start) + at;
      r.input_length = ids.size() * kMooncakeBlock - shapes.between(0, kMooncakeBlock - 64);
      r.output_length = shapes.between(20, 400);
      r.hash_ids = std::move(ids);
      out.push_back(std::move(r));
    }
    start += gap(shapes.rng());
  };
  auto by_arrival = [&] {
    std::stable_sort(out.begin(), out.end(), [](const TraceRequest& a, const TraceRequest& b) {
      return a.timestamp_ms < b.timestamp_ms;
    });
  };
  // Sessions until they hold n requests, then every session that starts before the n-th
  // arrival (its first requests belong among the first n); then the first n by arrival.
  while (out.size() < n) add_session();
  by_arrival();
  const uint64_t until = out[n - 1].timestamp_ms;
  while (start < static_cast<double>(until)) add_session();
  by_arrival();
  out.resize(n);
  for (uint64_t i = 0; i < out.size(); ++i) pad_ids(out[i], i, 1ull << 42);
  return out;
}

}  // namespace hybridkv::tools
