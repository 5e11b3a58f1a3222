// The shared tier's store on loopback (issue 33 item 8): put and get GB/s of 1, 2 and 4 MiB
// objects through SharedStore (batches of 16, one pipelined round trip each) beside
// redis-benchmark's SET and GET of the same sizes and pipeline depth against the same server in
// the same run, and the latency of one 64-block lookup (exists, and get of 64 KiB objects).
//
//   shared_store_bench [--mib-total 512]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hybridkv/shared_store.h"
#include "redis_server.h"

using namespace hybridkv;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// redis-benchmark's requests per second for one test ("SET" or "GET").
double redis_benchmark_rps(uint16_t port, const char* test, size_t bytes, int requests) {
  const std::string cmd = "redis-benchmark -h 127.0.0.1 -p " + std::to_string(port) + " -t " +
                          test + " -d " + std::to_string(bytes) + " -n " +
                          std::to_string(requests) + " -P 16 -c 1 -q --csv 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return 0;
  char line[512];
  double rps = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    // "test","rps",...: the header line has no number.
    const char* comma = std::strchr(line, ',');
    if (comma != nullptr && comma[1] == '"') rps = std::max(rps, std::atof(comma + 2));
  }
  ::pclose(f);
  return rps;
}

struct Rates {
  double put_gbps = 0, get_gbps = 0;
};

Rates store_rates(SharedStore& store, size_t bytes, size_t total, const std::string& tag) {
  constexpr size_t kBatch = 16;
  const size_t n = std::max<size_t>(kBatch, total / bytes / kBatch * kBatch);
  std::vector<std::byte> value(bytes);
  std::mt19937_64 rng(bytes);
  for (std::byte& b : value) b = std::byte(rng() & 0xff);
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back("bench:" + tag + ":" + std::to_string(i));
  std::vector<std::span<const std::byte>> values(kBatch, value);
  Rates r;
  auto t = Clock::now();
  for (size_t i = 0; i < n; i += kBatch) {
    for (StoreOutcome o : store.put(std::span(keys).subspan(i, kBatch), values)) {
      if (o != StoreOutcome::kOk) std::fprintf(stderr, "put: %s\n", store_outcome_name(o));
    }
  }
  r.put_gbps = static_cast<double>(n * bytes) / seconds_since(t) / 1e9;
  std::vector<std::vector<std::byte>> buffers(kBatch, std::vector<std::byte>(bytes));
  std::vector<std::span<std::byte>> spans(buffers.begin(), buffers.end());
  std::vector<uint64_t> sizes(kBatch);
  t = Clock::now();
  for (size_t i = 0; i < n; i += kBatch) {
    for (StoreOutcome o : store.get(std::span(keys).subspan(i, kBatch), spans, sizes)) {
      if (o != StoreOutcome::kOk) std::fprintf(stderr, "get: %s\n", store_outcome_name(o));
    }
  }
  r.get_gbps = static_cast<double>(n * bytes) / seconds_since(t) / 1e9;
  if (buffers[0] != value) std::fprintf(stderr, "get: wrong bytes\n");
  (void)store.remove(keys);
  return r;
}

// Median and p99 microseconds of `fn` over `runs` calls.
template <typename Fn>
std::pair<double, double> latency_us(int runs, Fn&& fn) {
  std::vector<double> us;
  for (int i = 0; i < runs; ++i) {
    const auto t = Clock::now();
    fn();
    us.push_back(seconds_since(t) * 1e6);
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

void lookups(SharedStore& store) {
  constexpr size_t kBlocks = 64, kBytes = 64 << 10;
  std::vector<std::string> keys;
  for (size_t i = 0; i < kBlocks; ++i) keys.push_back("bench:chain:" + std::to_string(i));
  std::vector<std::byte> value(kBytes, std::byte{7});
  std::vector<std::span<const std::byte>> values(kBlocks, value);
  (void)store.put(keys, values);
  const auto [exists_med, exists_p99] = latency_us(1000, [&] { (void)store.exists(keys); });
  std::vector<std::vector<std::byte>> buffers(kBlocks, std::vector<std::byte>(kBytes));
  std::vector<std::span<std::byte>> spans(buffers.begin(), buffers.end());
  std::vector<uint64_t> sizes(kBlocks);
  const auto [get_med, get_p99] = latency_us(200, [&] { (void)store.get(keys, spans, sizes); });
  std::printf("| 64-block lookup: exists (one pipeline) | median %.0f us | p99 %.0f us |\n",
              exists_med, exists_p99);
  std::printf(
      "| 64-block fetch: get of 64 x 64 KiB (one pipeline) | median %.0f us | p99 %.0f us |\n",
      get_med, get_p99);
  (void)store.remove(keys);
}

}  // namespace

int main(int argc, char** argv) {
  size_t total = 512ull << 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--mib-total") total = std::stoull(argv[i + 1]) << 20;
  }
  auto server = testing::RedisServer::start({"--maxmemory", "4gb"});
  if (!server) {
    std::fprintf(stderr, "redis-server is not installed (scripts/deps.sh installs it)\n");
    return 1;
  }
  Result<std::unique_ptr<SharedStore>> store = open_redis_store(server->config());
  if (!store) return 1;
  std::printf(
      "| object | hybridkv put GB/s | redis-benchmark SET GB/s | hybridkv get GB/s | "
      "redis-benchmark GET GB/s |\n|---|---:|---:|---:|---:|\n");
  for (size_t mib : {1, 2, 4}) {
    const size_t bytes = mib << 20;
    const Rates r = store_rates(**store, bytes, total, std::to_string(mib));
    const int requests = static_cast<int>(std::max<size_t>(64, total / bytes));
    const double set = redis_benchmark_rps(server->port(), "set", bytes, requests);
    const double get = redis_benchmark_rps(server->port(), "get", bytes, requests);
    std::printf("| %zu MiB | %.2f | %.2f | %.2f | %.2f |\n", mib, r.put_gbps,
                set * static_cast<double>(bytes) / 1e9, r.get_gbps,
                get * static_cast<double>(bytes) / 1e9);
  }
  std::printf("\n| measure | median | p99 |\n|---|---:|---:|\n");
  lookups(**store);
  return 0;
}
