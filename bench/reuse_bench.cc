// Prefix reuse costs: matching a 128k-token prompt against a tree of one million blocks next to
// hashing the same prompt alone, and commit throughput during prefill.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <vector>

#include "bench_models.h"
#include "hybridkv/manager.h"
#include "hybridkv/model.h"
#include "prefix/block_hash.h"
#include "util/xxh3.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hybridkv {
namespace {

constexpr uint32_t kTpb = 32;

ManagerConfig bench_config() {
  ManagerConfig c = model_config("nemotron_h_8b.json", kTpb);
  // Metadata only: a quota large enough for a million attention pages and their snapshots.
  c.tiers = {{TierKind::kGpu, 1ull << 40, ""}};
  c.pool_ratio = std::vector<double>{0.2, 0.8};
  return c;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 150000);
  return t;
}

// Commits `tokens` through a cache in prefill chunks; returns blocks committed.
uint64_t prefill_and_commit(KvCacheManager& m, const std::vector<int32_t>& tokens, uint64_t chunk) {
  CacheOptions o;
  o.input_tokens = tokens;
  auto cache = std::move(m.create_kv_cache(o)).value();
  if (!cache->resume({}).is_ok()) std::abort();
  const uint64_t start = cache->history();
  for (uint64_t at = start; at < tokens.size(); at += chunk) {
    const uint64_t end = std::min<uint64_t>(tokens.size(), at + chunk);
    if (!cache->resize(end, at).is_ok() || !cache->resize(end, end).is_ok()) std::abort();
    const std::span<const int32_t> span(tokens);
    if (!cache->commit(span.subspan(cache->committed_tokens(), end - cache->committed_tokens()))
             .is_ok()) {
      std::abort();
    }
  }
  (void)cache->close();
  return (tokens.size() - start) / kTpb;
}

struct BigTree {
  std::unique_ptr<KvCacheManager> manager;
  std::vector<int32_t> prompt;  // 128k tokens, all in the tree
  uint64_t blocks = 0;
};

BigTree& big_tree() {
  static BigTree* tree = [] {
    auto* t = new BigTree;
    BackendOptions none;
    none.kind = BackendKind::kNone;
    t->manager = std::move(KvCacheManager::create(bench_config(), none)).value();
    std::mt19937_64 rng(7);
    // Other requests, 32k tokens each, until the tree holds a million blocks; the 128k prompt
    // last, so that all its snapshots are still in the tree.
    while (t->blocks < 1'000'000 - 4096) {
      t->blocks += prefill_and_commit(*t->manager, random_tokens(rng, 32768), 8192);
    }
    t->prompt = random_tokens(rng, 131072);
    t->blocks += prefill_and_commit(*t->manager, t->prompt, 8192);
    return t;
  }();
  return *tree;
}

void BM_Match128kInMillionBlockTree(benchmark::State& state) {
  BigTree& t = big_tree();
  uint64_t reused = 0;
  for (auto _ : state) {
    reused = t.manager->probe_reuse({}, t.prompt).reused_tokens;
    benchmark::DoNotOptimize(reused);
  }
  state.counters["tree_blocks"] = static_cast<double>(t.manager->reuse_stats().tree_blocks);
  state.counters["reused_tokens"] = static_cast<double>(reused);
  state.SetItemsProcessed(state.iterations() * (t.prompt.size() / kTpb));
}
BENCHMARK(BM_Match128kInMillionBlockTree)->Unit(benchmark::kMillisecond);

void BM_Hash128kAlone(benchmark::State& state) {
  BigTree& t = big_tree();
  prefix::BlockHasher hasher(BlockHash::kSha256);
  for (auto _ : state) {
    BlockKey key = hasher.root({});
    const std::span<const int32_t> span(t.prompt);
    for (uint64_t b = 0; b + 1 < t.prompt.size() / kTpb; ++b) {
      key = hasher.key(key, span.subspan(b * kTpb, kTpb));
    }
    benchmark::DoNotOptimize(key);
  }
  state.SetItemsProcessed(state.iterations() * (t.prompt.size() / kTpb));
}
BENCHMARK(BM_Hash128kAlone)->Unit(benchmark::kMillisecond);

// The fingerprint create_kv_cache checks prompt keys with, over an 85,401-token prompt (the
// trace's 99th percentile): 0 the SSE2 code every x86-64 runs, 1 util::xxh3_64 (AVX2 where the
// CPU has it).
void BM_Fingerprint85k(benchmark::State& state) {
  std::mt19937_64 rng(13);
  const std::vector<int32_t> prompt = random_tokens(rng, 85401);
  const size_t bytes = prompt.size() * sizeof(int32_t);
  for (auto _ : state) {
    benchmark::DoNotOptimize(prompt.data());
    const uint64_t h = state.range(0) == 0 ? XXH3_64bits(prompt.data(), bytes)
                                           : util::xxh3_64(prompt.data(), bytes);
    benchmark::DoNotOptimize(h);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Fingerprint85k)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_CommitDuringPrefill(benchmark::State& state) {
  BackendOptions none;
  none.kind = BackendKind::kNone;
  auto manager = std::move(KvCacheManager::create(bench_config(), none)).value();
  std::mt19937_64 rng(11);
  uint64_t blocks = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::vector<int32_t> tokens = random_tokens(rng, 32768);
    state.ResumeTiming();
    blocks += prefill_and_commit(*manager, tokens, static_cast<uint64_t>(state.range(0)));
  }
  state.SetItemsProcessed(static_cast<int64_t>(blocks));
  state.counters["blocks_per_second"] =
      benchmark::Counter(static_cast<double>(blocks), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CommitDuringPrefill)->Arg(2048)->Arg(512)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hybridkv

BENCHMARK_MAIN();
