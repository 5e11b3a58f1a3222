// KvCacheManager: owns the storage plan, the memory backend, the slots and pages of every tier,
// and creates the per-request KvCaches.
//
// Thread-safety: every mutation (create, and every KvCache call) is serialized behind one
// mutex; statistics and checks take it too. shutdown() is refused while caches are open; the
// manager must outlive its caches.
// Cost: construction allocates every pool of every tier (host backend: zero-filled memory).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/kv_cache.h"
#include "hybridkv/memory.h"
#include "hybridkv/plan.h"
#include "hybridkv/stats.h"

namespace hybridkv {

// Requests in different scopes never share pages.
struct ReuseScope {
  std::optional<uint64_t> lora_id;
  std::optional<uint64_t> salt;
  bool operator==(const ReuseScope&) const = default;
};

struct CacheOptions {
  ReuseScope scope;
  std::vector<int32_t> input_tokens;  // the prompt (prefix matching uses it)
  uint32_t beam_width = 1;            // > 1: blocks past the prompt's full blocks are per beam
};

class KvCacheManager {
 public:
  static Result<std::unique_ptr<KvCacheManager>> create(const ManagerConfig& config,
                                                        const BackendOptions& backend = {});
  ~KvCacheManager();

  const StoragePlan& plan() const;

  // A new SUSPENDED cache. Refused (kRefused) beyond max_live_kv_caches living caches; beam
  // width > 1 is refused while a fixed PRIVATE pool exists.
  Result<std::unique_ptr<KvCache>> create_kv_cache(const CacheOptions& options);

  // Counters since the previous call (then reset).
  IterationStats take_iteration_stats();
  StorageStats storage_stats() const;
  // min(max_seq_len, the longest single request the GPU tier of this manager can hold).
  uint64_t clamp_max_seq_len_for_mem(uint64_t max_seq_len) const;
  // Refused (kFailedPrecondition) while caches are open.
  [[nodiscard]] Status shutdown();

  // Blocks until every copy up to `event` has completed.
  void wait(CopyEvent event);
  // Address of slot `slot` of pool `pool` of a pool group on a tier (nullptr: none backend).
  std::byte* slot_address(TierKind tier, PoolGroupId pool_group, uint32_t pool,
                          uint32_t slot) const;
  // Host backend test hook: a closed gate holds every copy until opened.
  void set_copy_gate(bool open);

  // Debug and tests: every invariant of slots, pages, queues and caches; empty when all hold.
  std::string check_invariants() const;
  // Debug and tests: the whole metadata state, for before/after equality.
  std::string debug_snapshot() const;

 private:
  explicit KvCacheManager(std::unique_ptr<cache_detail::ManagerCore> core);
  std::unique_ptr<cache_detail::ManagerCore> core_;
};

}  // namespace hybridkv
