// Page moves on the GPU machine, each next to its baseline measured in the same run:
//   limit     one 2 GiB pinned host<->device cudaMemcpyAsync (the bus, as ../shared/tools probes)
//   offload   GPU -> HOST of every attention page of many requests, Nemotron-H-8B plan, through
//   onboard   HOST -> GPU   the CUDA backend's copy engine (one batch, one gather kernel)
//   d2d       GPU -> GPU slot copies (snapshot copies): attention pages and SSM states
//   small     the fixed cost of an 8-page onboard (submit to completion), and of a manager
//             resume of one request with 8 pages on the host
// Baselines: the same pages one cudaMemcpyAsync per slot, and one per per-layer page (what a
// manager with one tensor per layer does). Prints a Markdown table.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "bench_models.h"
#include "cuda_bench.h"
#include "hybridkv/manager.h"
#include "memory/backend.h"

namespace hybridkv {
namespace {

using bench::best_seconds;
using bench::Clock;

void row(const char* what, const char* page, double bytes, double seconds, const char* note) {
  std::printf("| %s | %s | %.1f | %.2f ms | %s |\n", what, page, bytes / seconds / 1e9,
              seconds * 1e3, note);
}

void limit() {
  const size_t n = 2ull << 30;
  char *h = nullptr, *d = nullptr;
  CK(cudaHostAlloc(&h, n, cudaHostAllocDefault));
  CK(cudaMalloc(&d, n));
  std::memset(h, 1, n);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const double h2d = best_seconds(3, [&] {
    CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
  });
  const double d2h = best_seconds(3, [&] {
    CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
  });
  row("limit H2D (one 2 GiB copy)", "-", n, h2d, "the bus");
  row("limit D2H (one 2 GiB copy)", "-", n, d2h, "the bus");
  CK(cudaFree(d));
  CK(cudaFreeHost(h));
  CK(cudaStreamDestroy(s));
}

struct Setup {
  StoragePlan plan;
  std::unique_ptr<memory::MemoryBackend> backend;
  PoolGroupId attention;
  PoolGroupId ssm;
  uint64_t page_bytes = 0;  // one layer's key (or value) page
};

Setup setup(uint32_t tpb) {
  ManagerConfig c = model_config("nemotron_h_8b.json", tpb);
  c.tiers = {{TierKind::kGpu, 24ull << 30, ""}, {TierKind::kHost, 12ull << 30, ""}};
  Setup s{std::move(StoragePlan::build(c)).value(), nullptr, {}, {}, 0};
  s.backend = std::move(memory::make_backend({BackendKind::kCuda})).value();
  if (Status st = s.backend->allocate(s.plan); !st) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    std::exit(1);
  }
  for (const CacheGroup& g : s.plan.cache_groups()) {
    if (g.kind == GroupKind::kAttention) s.attention = g.pool_group;
    if (g.kind == GroupKind::kSsm) s.ssm = g.pool_group;
  }
  s.page_bytes = s.plan.buffers()[s.plan.cache_groups().back().buffers[0]].size;
  return s;
}

std::vector<memory::SlotCopy> batch(PoolGroupId pg, TierKind from, TierKind to, uint32_t n) {
  std::vector<memory::SlotCopy> b;
  for (uint32_t i = 0; i < n; ++i)
    b.push_back({pg, std::nullopt, from, i, to, i + (from == to ? n : 0)});
  return b;
}

// The same moves one cudaMemcpyAsync per `chunk` bytes of each slot.
double per_copy(Setup& s, PoolGroupId pg, TierKind from, TierKind to, uint32_t n, uint64_t chunk) {
  const uint64_t slot = s.plan.pool_group(pg).pools[0].slot_bytes;
  std::byte* src = s.backend->pool_base(from, pg, 0, 0);
  std::byte* dst = s.backend->pool_base(to, pg, 0, 0);
  const uint64_t dst_first = from == to ? n : 0;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const double t = best_seconds(3, [&] {
    for (uint32_t i = 0; i < n; ++i) {
      for (uint64_t at = 0; at < slot; at += chunk) {
        CK(cudaMemcpyAsync(dst + (dst_first + i) * slot + at, src + uint64_t{i} * slot + at,
                           std::min(chunk, slot - at), cudaMemcpyDefault, st));
      }
    }
    CK(cudaStreamSynchronize(st));
  });
  CK(cudaStreamDestroy(st));
  return t;
}

double engine(Setup& s, const std::vector<memory::SlotCopy>& b) {
  return best_seconds(3, [&] { s.backend->wait(s.backend->submit(b)); });
}

void moves(uint32_t tpb) {
  Setup s = setup(tpb);
  const uint64_t slot = s.plan.pool_group(s.attention).pools[0].slot_bytes;
  // 4 GiB of pages, or what both tiers hold.
  const uint32_t n = static_cast<uint32_t>(
      std::min<uint64_t>({(4ull << 30) / slot, s.plan.slots(TierKind::kHost, s.attention),
                          s.plan.slots(TierKind::kGpu, s.attention)}));
  const double bytes = double(n) * slot;
  char page[64];
  std::snprintf(page, sizeof page, "%llu KiB/layer (%llu KiB slot)",
                (unsigned long long)(s.page_bytes >> 10), (unsigned long long)(slot >> 10));
  for (const auto& [from, to, name] :
       {std::tuple{TierKind::kGpu, TierKind::kHost, "offload D2H"},
        std::tuple{TierKind::kHost, TierKind::kGpu, "onboard H2D"}}) {
    row((std::string(name) + ", hybridkv batch").c_str(), page, bytes,
        engine(s, batch(s.attention, from, to, n)), "one gather kernel");
    row((std::string(name) + ", cudaMemcpyAsync per slot").c_str(), page, bytes,
        per_copy(s, s.attention, from, to, n, slot), "baseline");
    row((std::string(name) + ", cudaMemcpyAsync per layer page").c_str(), page, bytes,
        per_copy(s, s.attention, from, to, n, s.page_bytes), "baseline (peer layout)");
  }
  const uint32_t half = n / 2;
  row("d2d attention, hybridkv batch", page, 2.0 * half * slot,
      engine(s, batch(s.attention, TierKind::kGpu, TierKind::kGpu, half)), "read + written");
  row("d2d attention, cudaMemcpyAsync per slot", page, 2.0 * half * slot,
      per_copy(s, s.attention, TierKind::kGpu, TierKind::kGpu, half, slot), "baseline");
  if (tpb == 32) {
    const uint64_t state = s.plan.pool_group(s.ssm).slot_bytes;
    const uint32_t states =
        static_cast<uint32_t>(std::min<uint64_t>(16, s.plan.slots(TierKind::kGpu, s.ssm) / 2));
    row("d2d SSM state snapshots, hybridkv batch", "97.4 MiB state", 2.0 * states * state,
        engine(s, batch(s.ssm, TierKind::kGpu, TierKind::kGpu, states)), "read + written");
  }
  const auto small = batch(s.attention, TierKind::kHost, TierKind::kGpu, 8);
  const double t_small = best_seconds(50, [&] { s.backend->wait(s.backend->submit(small)); });
  const double t_base = per_copy(s, s.attention, TierKind::kHost, TierKind::kGpu, 8, slot);
  std::printf("| small onboard (8 pages), hybridkv | %s | - | %.1f us | submit to completion |\n",
              page, t_small * 1e6);
  std::printf(
      "| small onboard (8 pages), cudaMemcpyAsync per slot | %s | - | %.1f us | baseline |\n", page,
      t_base * 1e6);
}

// A manager-level small resume: one request of 8 attention pages (Nemotron-H-8B's attention
// layers, 32 tokens per block) comes back from the host while 8 pages of a suspended request
// that fills the GPU go down to make room: resume() to its ready event, median of 50.
void small_resume() {
  ManagerConfig c = model_config("nemotron_h_8b.json", 32);
  c.ssm_layers.clear();
  c.tiers = {{TierKind::kGpu, 64ull << 20, ""}, {TierKind::kHost, 1ull << 30, ""}};
  c.max_live_kv_caches = 64;
  auto m = std::move(KvCacheManager::create(c, {BackendKind::kCuda})).value();
  const CacheGroupId g = m->plan().cache_groups().front().id;
  const uint64_t gpu_pages = m->plan().slots(TierKind::kGpu, m->plan().cache_group(g).pool_group);
  std::vector<std::unique_ptr<KvCache>> small;
  for (int i = 0; i < 50; ++i) {
    small.push_back(std::move(m->create_kv_cache({})).value());
    if (!small.back()->resume({}).is_ok() || !small.back()->resize(256, 0).is_ok() ||
        !small.back()->suspend().is_ok())
      std::exit(3);
  }
  auto big = std::move(m->create_kv_cache({})).value();
  if (!big->resume({}).is_ok() || !big->resize((gpu_pages - 8) * 32, 0).is_ok() ||
      !big->suspend().is_ok())
    std::exit(4);
  m->synchronize();
  std::vector<double> us;
  for (auto& cache : small) {
    const auto t0 = Clock::now();
    if (!cache->resume({}).is_ok()) std::exit(5);
    m->wait(cache->ready_event());
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!cache->suspend().is_ok()) std::exit(6);
  }
  std::sort(us.begin(), us.end());
  const IterationStats st = m->take_iteration_stats();
  std::printf(
      "| small resume through the manager (8 pages back, 8 pages out) | 64 KiB/layer "
      "(512 KiB slot) | - | %.1f us median (%.1f min) | %llu B onboarded in all |\n",
      us[us.size() / 2], us.front(), (unsigned long long)st.bytes_onboarded);
}

}  // namespace
}  // namespace hybridkv

int main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 0;
  }
  std::printf("device %s\n\n| move | page | GB/s | time | note |\n|---|---|---|---|---|\n",
              prop.name);
  hybridkv::limit();
  hybridkv::moves(8);
  hybridkv::moves(32);
  hybridkv::small_resume();
  return 0;
}
