// Lifecycle costs: a decode step of many requests (metadata only), the admission of a long
// prompt, and suspend/resume of a long request through the host tier next to a plain memcpy
// of the same bytes.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "bench_models.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/manager.h"
#include "hybridkv/model.h"

namespace hybridkv {
namespace {

CacheGroupId first_attention_group(const StoragePlan& plan) {
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind == GroupKind::kAttention) return g.id;
  }
  return CacheGroupId(0);
}

ManagerConfig nemotron_config(uint32_t tpb) { return model_config("nemotron_h_8b.json", tpb); }

// Nemotron-H under the hybrid manager, metadata only (none backend), as the sim runs it.
std::unique_ptr<HybridCacheManager> nemotron_hybrid(const ServingConfig& serving) {
  Result<ModelDescription> model =
      read_model_config(std::string(HKV_MODELS_DIR) + "/nemotron_h_8b.json", ModelOptions{});
  BackendOptions none;
  none.kind = BackendKind::kNone;
  return std::move(HybridCacheManager::create(*model, serving, none)).value();
}

// 256 decoding requests, each grown by one token per step: resize + block-table read.
void BM_DecodeStep256(benchmark::State& state) {
  constexpr int kRequests = 256;
  ManagerConfig c = nemotron_config(32);
  c.tiers = {{TierKind::kGpu, 80ull << 30, ""}};
  c.typical_step = BatchShape{std::vector<RequestShape>(kRequests, {2048, 2047}), {}};
  BackendOptions none;
  none.kind = BackendKind::kNone;
  auto manager = std::move(KvCacheManager::create(c, none)).value();
  std::vector<std::unique_ptr<KvCache>> caches;
  const CacheGroupId attention = first_attention_group(manager->plan());
  for (int i = 0; i < kRequests; ++i) {
    caches.push_back(std::move(manager->create_kv_cache({})).value());
    if (!caches.back()->resume({}).is_ok() || !caches.back()->resize(1024, 1023).is_ok()) {
      state.SkipWithError("setup failed");
      return;
    }
  }
  uint64_t tokens = 1024;
  int64_t checksum = 0;
  for (auto _ : state) {
    for (auto& cache : caches) {
      if (!cache->resize(tokens + 1, tokens).is_ok()) {
        state.SkipWithError("resize failed");
        return;
      }
      checksum += cache->block_table(attention)->back();
    }
    ++tokens;
  }
  benchmark::DoNotOptimize(checksum);
  state.SetItemsProcessed(state.iterations() * kRequests);
  state.counters["ns_per_request_step"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kRequests),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeStep256)->Iterations(2000)->Unit(benchmark::kMicrosecond);

// The admission of an 85,401-token prompt (the conversation trace's 99th percentile) on
// Nemotron-H (none backend, 16 GiB): add_request with its keys hashed ahead, can_resume and
// resume, as a scheduler's step does them; range(0) tokens per page; range(1): 0 for a new
// prompt, 1 when an earlier request computed and committed the prompt less its last token
// (the match walks the whole path and finds no snapshot at its end: it reuses nothing), 2 when
// the earlier request committed the whole prompt and this one extends it by a token (a
// conversation's next turn: it reuses all of it); range(2): 1 when the prompt is moved in
// (add_request(id, std::vector&&)), 0 when the manager copies it from a span. Counters: the
// tokens reused and the mean microseconds of each call (free_request is not in the time).
void BM_AdmitLongPrompt(benchmark::State& state) {
  constexpr uint64_t kTokens = 85401;
  ServingConfig serving;
  serving.tokens_per_block = static_cast<uint32_t>(state.range(0));
  auto h = nemotron_hybrid(serving);
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(kTokens);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 100000);
  uint64_t id = 0;
  if (state.range(1) > 0) {  // an earlier request computed and committed it
    if (!h->add_request(id, prompt).is_ok() || !h->resume(id).is_ok() ||
        !h->resize(id, kTokens, kTokens).is_ok() || !h->commit_at_snapshot(id).is_ok() ||
        !h->free_request(id).is_ok()) {
      state.SkipWithError("setup failed");
      return;
    }
  }
  if (state.range(1) == 2) prompt.push_back(1);
  using Clock = std::chrono::steady_clock;
  const auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  double add_us = 0, can_us = 0, resume_us = 0;
  uint64_t reused = 0;
  for (auto _ : state) {
    state.PauseTiming();
    ++id;
    std::shared_ptr<const PromptKeys> keys = h->manager().hash_prompt({}, prompt);
    std::vector<int32_t> handed = prompt;  // moved in with range(2) == 1
    state.ResumeTiming();
    const Clock::time_point t0 = Clock::now();
    const Status added =
        state.range(2) == 1
            ? h->add_request(id, std::move(handed), {}, std::move(keys))
            : h->add_request(id, std::span<const int32_t>(prompt), {}, std::move(keys));
    const Clock::time_point t1 = Clock::now();
    const bool can = added.is_ok() && h->cache(id)->can_resume().is_ok();
    const Clock::time_point t2 = Clock::now();
    if (!can || !h->resume(id).is_ok()) {
      state.SkipWithError("admission failed");
      return;
    }
    const Clock::time_point t3 = Clock::now();
    state.PauseTiming();
    add_us += us(t0, t1);
    can_us += us(t1, t2);
    resume_us += us(t2, t3);
    reused = h->cache(id)->reuse_match().reused_tokens;
    (void)h->free_request(id);
    state.ResumeTiming();
  }
  const auto n = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["reused"] = static_cast<double>(reused);
  state.counters["add_us"] = add_us / n;
  state.counters["can_resume_us"] = can_us / n;
  state.counters["resume_us"] = resume_us / n;
}
BENCHMARK(BM_AdmitLongPrompt)
    ->ArgsProduct({{32, 512}, {0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

// One prefill chunk of 8,192 tokens of a new 85,401-token prompt on Nemotron-H (none backend,
// 16 GiB, free slots for every page), as the sim's step does it: resize to the chunk's end,
// reserve the states the kernel writes inside it, and the history's advance after the step.
// range(0): tokens per page; range(1): 1 for the sim's snapshot policy (periodic:512 written
// inside the chunk), 0 for snapshots at the prompt's end only. Per chunk.
void BM_PrefillChunk(benchmark::State& state) {
  constexpr uint64_t kTokens = 85401;
  constexpr uint64_t kChunk = 8192;
  ServingConfig serving;
  serving.tokens_per_block = static_cast<uint32_t>(state.range(0));
  if (state.range(1) == 1) {
    serving.snapshots.periodic_interval = 512;
    serving.snapshots.chunk_states = true;
  }
  auto h = nemotron_hybrid(serving);
  std::mt19937 rng(11);
  std::vector<int32_t> prompt(kTokens);
  uint64_t id = 0, chunks = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 100000);  // nothing to reuse
    if (!h->add_request(++id, prompt).is_ok() || !h->resume(id).is_ok()) {
      state.SkipWithError("admission failed");
      return;
    }
    state.ResumeTiming();
    for (uint64_t history = 0; history < kTokens;) {
      const uint64_t upto = std::min(history + kChunk, kTokens);
      bool ok = h->resize(id, upto, history).is_ok();
      if (ok && serving.snapshots.chunk_states) ok = h->reserve_chunk_states(id, upto).is_ok();
      if (!ok || !h->resize(id, upto, upto).is_ok()) {
        state.SkipWithError("prefill failed");
        return;
      }
      state.PauseTiming();
      if (!h->commit_at_snapshot(id).is_ok()) {
        state.SkipWithError("commit failed");
        return;
      }
      state.ResumeTiming();
      history = upto;
      ++chunks;
    }
    state.PauseTiming();
    (void)h->free_request(id);
    h->manager().clear_reusable_blocks();  // every chunk finds free slots
    state.ResumeTiming();
  }
  state.counters["s_per_chunk"] = benchmark::Counter(
      static_cast<double>(chunks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PrefillChunk)
    ->Args({32, 1})
    ->Args({32, 0})
    ->Args({512, 1})
    ->Args({512, 0})
    ->Unit(benchmark::kMicrosecond);

// A 32k-token Nemotron-H request is pushed to the host tier by a request that takes every GPU
// attention slot, then resumed: bytes moved per second, both ways (host backend).
void BM_SuspendResume32k(benchmark::State& state) {
  ManagerConfig c = nemotron_config(32);
  c.tiers = {{TierKind::kGpu, 768ull << 20, ""}, {TierKind::kHost, 1ull << 30, ""}};
  c.pool_ratio = std::vector<double>{0.2, 0.8};
  auto manager = std::move(KvCacheManager::create(c)).value();
  const PoolGroupId attention_pg =
      manager->plan().cache_group(first_attention_group(manager->plan())).pool_group;
  const uint64_t gpu_slots = manager->plan().slots(TierKind::kGpu, attention_pg);
  auto a = std::move(manager->create_kv_cache({})).value();
  if (!a->resume({}).is_ok() || !a->resize(32768, 32768).is_ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  if (!a->suspend().is_ok()) return;
  // One cycle is the whole measurement; the host backend's pools come zeroed from the kernel
  // and are faulted in on first touch, so a first, untimed cycle measures steady state.
  auto cycle = [&]() -> bool {
    auto b = std::move(manager->create_kv_cache({})).value();
    if (!b->resume({}).is_ok() || !b->resize(gpu_slots * 32, 0).is_ok()) return false;
    manager->wait(b->ready_event());  // the offload of A has completed
    (void)b->close();
    if (!a->resume({}).is_ok()) return false;
    manager->wait(a->ready_event());  // the onboard of A has completed
    return a->suspend().is_ok();
  };
  if (!cycle()) {
    state.SkipWithError("warm-up failed");
    return;
  }
  (void)manager->take_iteration_stats();
  uint64_t bytes = 0;
  for (auto _ : state) {
    auto b = std::move(manager->create_kv_cache({})).value();
    if (!b->resume({}).is_ok() || !b->resize(gpu_slots * 32, 0).is_ok()) {
      state.SkipWithError("pressure failed");
      return;
    }
    manager->wait(b->ready_event());  // the offload of A has completed
    (void)b->close();
    if (!a->resume({}).is_ok()) {
      state.SkipWithError("resume failed");
      return;
    }
    manager->wait(a->ready_event());  // the onboard of A has completed
    (void)a->suspend();
    const IterationStats s = manager->take_iteration_stats();
    bytes += s.bytes_offloaded + s.bytes_onboarded;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_SuspendResume32k)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

// A plain memcpy of 32k tokens of Nemotron-H KV (512 MiB), both ways, as the yardstick.
void BM_Memcpy32kBothWays(benchmark::State& state) {
  const size_t bytes = 32768ull * 16384;
  std::unique_ptr<std::byte[]> a(new std::byte[bytes]), b(new std::byte[bytes]);
  std::memset(a.get(), 1, bytes);
  std::memset(b.get(), 2, bytes);
  for (auto _ : state) {
    std::memcpy(b.get(), a.get(), bytes);
    std::memcpy(a.get(), b.get(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}
BENCHMARK(BM_Memcpy32kBothWays)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace hybridkv

BENCHMARK_MAIN();
