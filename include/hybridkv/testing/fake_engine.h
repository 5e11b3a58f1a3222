// FakeEngine: stands in for the model kernels and proves that every page holds what it should.
//
// It writes into every page it is given, on every rank (KvCacheManager::ranks), bytes derived
// from (scope, token prefix, layer, role, rank, position): the KV of token p depends on the scope
// and tokens [0, p]; an SSM state after n tokens depends on the scope and tokens [0, n). On every
// step it first checks every page the step would read, so a misplaced, stale, lost or overwritten
// page shows up as a mismatch that names the group, layer, role, block and slot.
//
// Thread-safety: one engine per thread; it calls the manager's thread-safe API.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hybridkv/manager.h"

namespace hybridkv::testing {

struct FakeRequest {
  ReuseScope scope;
  std::vector<std::vector<int32_t>> tokens;        // per beam: prompt then generated tokens
  uint64_t computed = 0;                           // tokens whose KV and state are written
  bool state_written = false;                      // false until the first step wrote the states
  std::vector<std::vector<uint64_t>> prefix_hash;  // per beam, filled by the engine
  // A request created with reuse: at its first ACTIVE step the engine initializes what the
  // tree does not hold (PRIVATE groups, and these unselected OPTIONAL groups).
  bool initialize_on_first_use = false;
  std::vector<CacheGroupId> unselected_optional;
};

// What every written word is: (random & keep) | set. Reduced-precision snapshots need fp32
// buffers whose values survive the round trip bit for bit: bf16-exact (the low half and the
// top exponent bit cleared) or fp8-exact (3 mantissa bits, exponents within 8 binades).
struct WordShape {
  uint64_t keep = ~0ull;
  uint64_t set = 0;
  uint64_t apply(uint64_t word) const { return (word & keep) | set; }
};

class FakeEngine {
 public:
  explicit FakeEngine(KvCacheManager& manager);

  // Checks at most this many bytes at each end of every token region and state (0: all bytes).
  // Writes always cover every byte. Sampling keeps long randomized runs fast; whole pages move
  // between slots, so a misplaced page still shows at its first bytes.
  void set_sampled_check(uint64_t bytes_per_end) { sample_bytes_ = bytes_per_end; }
  // Writes too only that many bytes at each end of every region (0: every byte). For long
  // simulations of real-size models, where writing whole states each step would dominate.
  void set_sampled_writes(uint64_t bytes_per_end) { sample_writes_ = bytes_per_end; }
  // Reads and writes pool bytes through staging copies (testing::read_pool_bytes), as
  // it must for the CUDA backend's GPU tier; on by itself there, and settable so that the host
  // backend's tests cover that path too.
  void set_staged_access(bool on) { device_memory_ = on; }

  // Waits for the cache's pages, checks what the step reads, then writes KV for tokens
  // [computed, upto) and the states after `upto` tokens. Requires: ACTIVE, capacity >= upto,
  // upto <= tokens of every beam.
  Status step(const KvCache& cache, FakeRequest& request, uint64_t upto);
  // The writes of step() without its checks (callers that verify at chosen points instead).
  Status write_step(const KvCache& cache, FakeRequest& request, uint64_t upto);
  // The states of `group` after each of `points` tokens into the reserved `slots` (a kernel
  // that writes states inside its chunk: KvCache::reserve_states), as write_step would at
  // history = point.
  void write_states_at(const KvCache& cache, FakeRequest& request, CacheGroupId group,
                       std::span<const uint64_t> points, std::span<const int32_t> slots);
  // Waits for the cache's pages and checks every resident page.
  Status verify(const KvCache& cache, FakeRequest& request);
  // Recomputes one group's pages for the tokens already computed (an OPTIONAL group that was
  // not selected at the first resume starts from fresh pages).
  Status recompute_group(const KvCache& cache, FakeRequest& request, CacheGroupId group);
  // Takes over a cache created with reuse: its reused tokens count as computed.
  static void adopt_reuse(const KvCache& cache, FakeRequest& request);

  uint64_t pages_checked() const { return pages_checked_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  struct Buffer {
    LayerId layer;
    uint64_t role_hash;
    PoolGroupId pool_group;
    uint32_t pool;
    uint64_t offset;
    uint64_t size;
    std::string name;
    WordShape shape;
    uint32_t rank;  // KvCacheManager::ranks: every rank's pages are written and checked
  };
  void add_buffers(const CacheGroup& g, uint32_t rank, uint32_t ranks);
  uint64_t prefix(FakeRequest& r, uint32_t beam, uint64_t tokens);
  Status write(const KvCache& cache, FakeRequest& r, uint64_t from, uint64_t upto,
               const CacheGroup* only);
  std::byte* page(const Buffer& b, int32_t slot) const;
  Status check_bytes(const std::byte* at, uint64_t n, uint64_t seed, const std::string& what,
                     WordShape shape = {});
  void fill_bytes(std::byte* at, uint64_t n, uint64_t seed, WordShape shape = {});

  KvCacheManager& manager_;
  std::vector<std::vector<Buffer>> buffers_;  // by cache group
  static std::pair<uint64_t, uint64_t> sample_ranges(uint64_t n, uint64_t sample);
  static void generate(std::byte* out, uint64_t lo, uint64_t hi, uint64_t seed, WordShape shape);
  void write_tokens(FakeRequest& r, uint32_t beam, const Buffer& b, std::byte* at, uint64_t p,
                    uint64_t end);
  Status write_unflushed(const KvCache& cache, FakeRequest& r, uint64_t from, uint64_t upto,
                         const CacheGroup* only);
  std::byte* stage_write(std::byte* pool, uint64_t n);
  void flush_writes();
  // verify() collects its checks, reads every region they look at (device memory: one batched
  // transfer), then runs them.
  struct Region {
    const std::byte* pool;
    uint64_t n;
    bool sampled;    // only the sampled ends are read (set_sampled_check)
    uint64_t stage;  // offset in stage_
  };
  struct Check {
    uint32_t region;
    uint64_t offset, n, seed;
    WordShape shape;
    std::string what;
  };
  struct PendingWrite {
    std::byte* pool;
    uint64_t stage;  // offset in write_stage_
    uint64_t n;
  };
  Status collect_checks(const KvCache& cache, FakeRequest& r);
  Status run_checks();
  uint32_t add_region(const std::byte* pool, uint64_t n, bool sampled);
  std::vector<Region> regions_;
  std::vector<Check> checks_;
  std::vector<std::byte> stage_;
  uint64_t stage_bytes_ = 0;
  std::vector<PendingWrite> pending_writes_;
  std::vector<std::byte> write_stage_;
  bool device_memory_ = false;  // GPU-tier pools are not CPU-addressable
  uint64_t sample_bytes_ = 0;
  uint64_t sample_writes_ = 0;
  uint64_t pages_checked_ = 0;
  uint64_t bytes_written_ = 0;
};

}  // namespace hybridkv::testing
