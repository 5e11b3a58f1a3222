// The DISK tier against the directory's own sequential throughput, measured in the same run:
// a 32k-token Nemotron-H-8B request (1,024 attention pages of 512 KiB and one 97 MiB SSM state)
// moved to the disk and back through the backend's copy engine, bytes checked, next to a
// dd-style O_DIRECT sequential write and read of a file of the same size in that directory.
//   disk_tier_bench DIRECTORY [host|cuda]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_models.h"
#include "memory/backend.h"

namespace hybridkv {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// dd-style: 4 MiB O_DIRECT blocks, written (then fsync) and read back.
std::pair<double, double> sequential(const std::string& dir, uint64_t bytes, bool& direct) {
  const std::string path = dir + "/hybridkv-dd-test";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  unlink(path.c_str());
  const uint64_t block = 4ull << 20;
  auto* buf = static_cast<std::byte*>(std::aligned_alloc(4096, block));
  std::memset(buf, 0x5a, block);
  auto t0 = Clock::now();
  for (uint64_t at = 0; at < bytes; at += block)
    if (pwrite(fd, buf, block, static_cast<off_t>(at)) != static_cast<ssize_t>(block)) std::abort();
  fsync(fd);
  const double w = since(t0);
  t0 = Clock::now();
  for (uint64_t at = 0; at < bytes; at += block)
    if (pread(fd, buf, block, static_cast<off_t>(at)) != static_cast<ssize_t>(block)) std::abort();
  const double r = since(t0);
  ::close(fd);
  std::free(buf);
  return {w, r};
}

int run(const std::string& dir, BackendKind kind) {
  ManagerConfig c = model_config("nemotron_h_8b.json", 32);
  c.tiers = {{TierKind::kGpu, 8ull << 30, ""},
             {TierKind::kHost, 4ull << 30, ""},
             {TierKind::kDisk, 8ull << 30, dir}};
  StoragePlan plan = std::move(StoragePlan::build(c)).value();
  std::unique_ptr<memory::MemoryBackend> backend = std::move(memory::make_backend({kind})).value();
  if (Status s = backend->allocate(plan); !s) {
    std::printf("%s\n", s.to_string().c_str());
    return 1;
  }
  PoolGroupId attention, ssm;
  for (const CacheGroup& g : plan.cache_groups()) {
    (g.kind == GroupKind::kAttention ? attention : ssm) = g.pool_group;
  }
  // The request: 32,768 tokens at 32 per block, plus its state.
  std::vector<memory::SlotCopy> out, in, to_host, host_out, host_in;
  for (uint32_t i = 0; i < 1024; ++i) {
    out.push_back({attention, std::nullopt, TierKind::kGpu, i, TierKind::kDisk, i});
    in.push_back({attention, std::nullopt, TierKind::kDisk, i, TierKind::kGpu, i});
  }
  out.push_back({ssm, std::nullopt, TierKind::kGpu, 0, TierKind::kDisk, 0});
  in.push_back({ssm, std::nullopt, TierKind::kDisk, 0, TierKind::kGpu, 0});
  for (const memory::SlotCopy& o : out) {
    to_host.push_back(
        {o.pool_group, std::nullopt, TierKind::kGpu, o.src_slot, TierKind::kHost, o.src_slot});
    host_out.push_back(
        {o.pool_group, std::nullopt, TierKind::kHost, o.src_slot, TierKind::kDisk, o.dst_slot});
    host_in.push_back(
        {o.pool_group, std::nullopt, TierKind::kDisk, o.dst_slot, TierKind::kHost, o.src_slot});
  }
  // Random bytes in every GPU page of the request.
  uint64_t bytes = 0;
  std::vector<std::pair<std::byte*, uint64_t>> pages;
  for (const memory::SlotCopy& o : out) {
    const PoolGroup& pg = plan.pool_group(o.pool_group);
    for (uint32_t p = 0; p < pg.pools.size(); ++p) {
      pages.emplace_back(
          backend->pool_base(TierKind::kGpu, pg.id, p, 0) + o.src_slot * pg.pools[p].slot_bytes,
          pg.pools[p].slot_bytes);
      bytes += pg.pools[p].slot_bytes;
    }
  }
  std::mt19937_64 rng(1);
  std::vector<std::vector<uint64_t>> expected;
  for (const auto& [at, n] : pages) {
    expected.emplace_back(n / 8);
    for (uint64_t& w : expected.back()) w = rng();
    backend->write_bytes(at, expected.back().data(), n);
  }
  auto t0 = Clock::now();
  backend->wait(backend->submit(out));
  const double t_out = since(t0);
  for (const auto& [at, n] : pages) {
    const std::span<std::byte> s(at, n);
    backend->fill({&s, 1}, 0, {});
  }
  backend->wait(backend->submit(to_host));  // zeros on the host side too
  t0 = Clock::now();
  backend->wait(backend->submit(in));
  const double t_in = since(t0);
  size_t bad = 0;
  std::vector<uint64_t> seen;
  for (size_t i = 0; i < pages.size(); ++i) {
    seen.resize(pages[i].second / 8);
    backend->read_bytes(seen.data(), pages[i].first, pages[i].second);
    bad += seen != expected[i];
  }
  t0 = Clock::now();
  backend->wait(backend->submit(host_out));
  const double t_host_out = since(t0);
  t0 = Clock::now();
  backend->wait(backend->submit(host_in));
  const double t_host_in = since(t0);
  bool direct = false;
  const auto [w, r] = sequential(dir, bytes, direct);
  std::printf(
      "request %.1f MiB (%zu pool pages); copy status: %s; pages differing after the "
      "round trip: %zu\n\n",
      bytes / 1048576.0, pages.size(), backend->copy_status().to_string().c_str(), bad);
  std::printf("| move | GB/s | time |\n|---|---|---|\n");
  auto row = [&](const char* what, double t) {
    std::printf("| %s | %.2f | %.0f ms |\n", what, bytes / t / 1e9, t * 1e3);
  };
  row("GPU -> DISK (suspend to disk)", t_out);
  row("DISK -> GPU (resume from disk)", t_in);
  row("HOST -> DISK", t_host_out);
  row("DISK -> HOST", t_host_in);
  row(direct ? "sequential write, O_DIRECT 4 MiB blocks + fsync (dd-style)"
             : "sequential write, buffered 4 MiB blocks + fsync (no O_DIRECT here)",
      w);
  row(direct ? "sequential read, O_DIRECT 4 MiB blocks" : "sequential read, buffered", r);
  return bad == 0 ? 0 : 2;
}

}  // namespace
}  // namespace hybridkv

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: disk_tier_bench DIRECTORY [host|cuda]\n");
    return 1;
  }
  const bool cuda = argc > 2 && std::string(argv[2]) == "cuda";
  return hybridkv::run(argv[1], cuda ? hybridkv::BackendKind::kCuda : hybridkv::BackendKind::kHost);
}
