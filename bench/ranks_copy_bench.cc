// Several devices moving at once (issue 34): one CUDA backend holding one tensor-parallel rank
// per device (BackendOptions::devices; every visible GPU, or the ids given as arguments) runs
// each offload (GPU -> HOST) and onboard (HOST -> GPU) batch on every device at once. Each
// device's rate is its rank's bytes over the time both took, next to its own bus limit measured
// in the same run (one 2 GiB pinned cudaMemcpyAsync on that device alone, best of 3) and that
// limit again with every device copying at once. Prints a Markdown table.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_models.h"
#include "cuda_bench.h"
#include "hybridkv/manager.h"
#include "memory/backend.h"

namespace hybridkv {
namespace {

using bench::best_seconds;
using bench::Clock;

// One device's 2 GiB pinned buffer and device buffer, for the bus limit.
struct Bus {
  int device = 0;
  char* host = nullptr;
  char* dev = nullptr;
  cudaStream_t stream = nullptr;
};
constexpr size_t kLimitBytes = 2ull << 30;

std::vector<Bus> open_buses(const std::vector<int>& devices) {
  std::vector<Bus> buses;
  for (int d : devices) {
    Bus b{d};
    CK(cudaSetDevice(d));
    CK(cudaHostAlloc(&b.host, kLimitBytes, cudaHostAllocPortable));
    CK(cudaMalloc(&b.dev, kLimitBytes));
    std::memset(b.host, 1, kLimitBytes);
    CK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
    buses.push_back(b);
  }
  return buses;
}

// The bus limit of the devices in `which` copying at once: seconds for one 2 GiB copy each.
double bus_seconds(std::vector<Bus>& buses, const std::vector<size_t>& which, bool to_device) {
  return best_seconds(3, [&] {
    for (size_t i : which) {
      Bus& b = buses[i];
      CK(cudaSetDevice(b.device));
      CK(to_device ? cudaMemcpyAsync(b.dev, b.host, kLimitBytes, cudaMemcpyHostToDevice, b.stream)
                   : cudaMemcpyAsync(b.host, b.dev, kLimitBytes, cudaMemcpyDeviceToHost, b.stream));
    }
    for (size_t i : which) CK(cudaStreamSynchronize(buses[i].stream));
  });
}

void run(const std::vector<int>& devices) {
  ManagerConfig c = model_config("nemotron_h_8b.json", 32);
  c.tiers = {{TierKind::kGpu, 24ull << 30, ""}, {TierKind::kHost, 12ull << 30, ""}};
  const StoragePlan plan = std::move(StoragePlan::build(c)).value();
  BackendOptions o{BackendKind::kCuda};
  o.devices = devices;
  auto backend = std::move(memory::make_backend(o)).value();
  if (Status s = backend->allocate(plan); !s) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    std::exit(1);
  }
  PoolGroupId attention;
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind == GroupKind::kAttention) attention = g.pool_group;
  }
  const uint64_t slot = plan.pool_group(attention).slot_bytes;
  const uint32_t n = static_cast<uint32_t>(
      std::min<uint64_t>({(4ull << 30) / slot, plan.slots(TierKind::kHost, attention),
                          plan.slots(TierKind::kGpu, attention)}));
  const double rank_bytes = double(n) * slot;

  std::vector<Bus> buses = open_buses(devices);
  std::vector<size_t> all(devices.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::printf("| move | device | GB/s | its bus alone | its bus, all at once | ratio to alone |\n");
  std::printf("|---|---|---|---|---|---|\n");
  double worst = 1e30;
  for (const auto& [from, to, name] :
       {std::tuple{TierKind::kGpu, TierKind::kHost, "offload D2H"},
        std::tuple{TierKind::kHost, TierKind::kGpu, "onboard H2D"}}) {
    const bool h2d = to == TierKind::kGpu;
    std::vector<double> alone, together;
    for (size_t i = 0; i < buses.size(); ++i) alone.push_back(bus_seconds(buses, {i}, h2d));
    const double both = bus_seconds(buses, all, h2d);
    std::vector<memory::SlotCopy> b;
    for (uint32_t i = 0; i < n; ++i) b.push_back({attention, std::nullopt, from, i, to, i});
    const double t = best_seconds(3, [&] { backend->wait(backend->submit(b)); });
    for (size_t i = 0; i < buses.size(); ++i) {
      const double rate = rank_bytes / t / 1e9, bus = kLimitBytes / alone[i] / 1e9;
      worst = std::min(worst, rate / bus);
      std::printf("| %s, %zu ranks in one batch | %d | %.1f | %.1f | %.1f | %.3f |\n", name,
                  devices.size(), devices[i], rate, bus, kLimitBytes / both / 1e9, rate / bus);
    }
  }
  std::printf("\n%u pages of %llu KiB per rank (%.2f GiB); lowest ratio to its own bus: %.3f\n", n,
              (unsigned long long)(slot >> 10), rank_bytes / (1ull << 30), worst);
  for (Bus& b : buses) {
    CK(cudaSetDevice(b.device));
    CK(cudaFree(b.dev));
    CK(cudaFreeHost(b.host));
    CK(cudaStreamDestroy(b.stream));
  }
}

}  // namespace
}  // namespace hybridkv

int main(int argc, char** argv) {
  std::vector<int> devices;
  for (int i = 1; i < argc; ++i) devices.push_back(std::atoi(argv[i]));
  if (devices.empty()) {
    for (int d = 0; d < hybridkv::cuda_device_count(); ++d) devices.push_back(d);
  }
  if (devices.empty()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, devices.front()));
  std::printf("%zu rank(s) on %s\n\n", devices.size(), prop.name);
  hybridkv::run(devices);
  return 0;
}
