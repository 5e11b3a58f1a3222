// KvCacheManager: owns the storage plan, the memory backend, the slots and pages of every tier,
// and creates the per-request KvCaches.
//
// Thread-safety: every mutation (create, and every KvCache call) is serialized behind one
// mutex; reads (statistics, probes, block tables) take it shared. shutdown() is refused while
// caches are open. Caches may outlive the manager: they share its state, which is freed with
// the last of them.
// Cost: construction allocates every pool of every tier (host backend: zero-filled memory).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/engine_memory.h"
#include "hybridkv/kv_cache.h"
#include "hybridkv/memory.h"
#include "hybridkv/plan.h"
#include "hybridkv/reuse.h"
#include "hybridkv/shared_store.h"
#include "hybridkv/stats.h"

namespace hybridkv {

// The block keys of a prompt's full blocks, computed ahead of its request
// (KvCacheManager::hash_prompt: any thread, before the scheduler takes the request), so that
// matching it and committing its blocks hash nothing on the scheduler's step. Valid for the
// tokens, scope and multimodal items it was computed for, on managers of the same
// tokens_per_block and block hash; create_kv_cache refuses it for anything else.
class PromptKeys {
 public:
  uint64_t blocks() const { return keys_.size(); }  // full blocks covered
  uint64_t tokens() const { return tokens_; }

 private:
  friend struct cache_detail::CoreAccess;
  ReuseScope scope_;
  uint32_t tokens_per_block_ = 0;
  BlockHash kind_ = BlockHash::kSha256;
  uint64_t tokens_ = 0;
  uint64_t fingerprint_ = 0;  // of the tokens and multimodal items
  std::vector<BlockKey> keys_;
};

struct CacheOptions {
  ReuseScope scope;
  std::vector<int32_t> input_tokens;       // the prompt (prefix matching uses it)
  uint32_t beam_width = 1;                 // > 1: blocks past the prompt's full blocks are per beam
  std::vector<MultimodalItem> multimodal;  // items whose digests enter the block keys
  // SWA scratch for this request (unset: ManagerConfig::swa_scratch_reuse); true requires it.
  std::optional<bool> swa_scratch;
  // Names the cache in error messages ("request 20"); empty: "cache <internal id>".
  std::string label;
  // The prompt's block keys, computed ahead (KvCacheManager::hash_prompt); null: hashed here.
  std::shared_ptr<const PromptKeys> prompt_keys = nullptr;
};

// One cache's new size in KvCacheManager::resize_all (KvCache::resize's arguments).
struct CacheResize {
  KvCache* cache = nullptr;
  uint64_t capacity = 0;
  uint64_t history = 0;
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
  // The same, the prompt's tokens moved into the cache instead of copied (a long prompt is
  // hundreds of KB, and each pass over it shows in the step that admits it). On an error
  // `options` is left as it was.
  Result<std::unique_ptr<KvCache>> create_kv_cache(CacheOptions&& options);

  // What create_kv_cache would reuse for this prompt, changing nothing. Safe to call from
  // several threads at once (it takes the manager's lock shared).
  ReuseMatch probe_reuse(const ReuseScope& scope, std::span<const int32_t> tokens,
                         std::span<const MultimodalItem> multimodal = {}) const;
  // The keys of the prompt's full blocks for CacheOptions::prompt_keys. Thread-safe and reads
  // no state but the config: a scheduler hashes prompts as they arrive (another thread, or
  // between steps) instead of inside the step that admits them. Cost: the hashing
  // create_kv_cache and the prompt's commits would otherwise do, once.
  std::shared_ptr<const PromptKeys> hash_prompt(
      const ReuseScope& scope, std::span<const int32_t> tokens,
      std::span<const MultimodalItem> multimodal = {}) const;
  // Several resizes as one operation (a decode step's batch): every cache's resize is checked
  // and the room for all of them counted before anything changes; on any error (a cache listed
  // twice, one not ACTIVE or of another manager, no room) nothing changed.
  [[nodiscard]] Status resize_all(std::span<const CacheResize> resizes);
  // Unlinks every page from the prefix tree (pages held by caches stay with them).
  void clear_reusable_blocks();
  // Tree events since the previous call (ManagerConfig::record_events).
  std::vector<CacheEvent> take_events();
  ReuseStats reuse_stats() const;
  // reuse_stats() (snapshot statistics included), then its counters restart from zero: an
  // engine exporting per-interval figures calls this once per interval.
  ReuseStats take_reuse_stats();

  // Counters since the previous call (then reset): call it once per step for per-step figures;
  // IterationStats::groups splits them by cache group.
  IterationStats take_iteration_stats();
  StorageStats storage_stats() const;
  // min(max_seq_len, the longest single request the GPU tier of this manager can hold).
  uint64_t clamp_max_seq_len_for_mem(uint64_t max_seq_len) const;
  // min(max_seq_len, the longest sequence that `batch_size` requests can each have while they
  // are ACTIVE together); 0 when such a batch does not fit at all. Refused for batch_size 0.
  Result<uint64_t> clamp_max_seq_len(uint64_t batch_size, uint64_t max_seq_len) const;
  // The quota in force on a tier (the configured one until set_quota changes it); kNotFound
  // for a tier that is not configured.
  Result<uint64_t> quota(TierKind tier) const;
  // Changes a tier's quota while caches live; the pool groups' slots follow the plan's split at
  // the new quota (estimate_slots). Shrinking drops or demotes DROPPABLE pages, then demotes HELD
  // ones, and moves the pages left above the new end into free slots (ACTIVE caches' tables
  // follow; wait for their ready_event()). Refused, changing nothing: below the GPU floors
  // (kInvalidArgument), beyond the slots reserved for max_quota_bytes (kRefused), LOCKED pages
  // alone exceeding a pool group's new slots or HELD pages with nowhere to go (kOutOfPages).
  // plan() keeps describing the quotas the manager was built with.
  [[nodiscard]] Status set_quota(TierKind tier, uint64_t quota_bytes);
  // --- one budget (ManagerConfig::policies.rebalance) ---
  // Whether a rebalancing step would move slots between pool groups now: a pool group whose
  // next victim is much younger than another's (one LRU over the tier's bytes would keep them
  // equal) and that has evicted since the last step. Cheap; false with rebalancing off.
  bool need_adjustment() const;
  // Takes that step on every tier that needs it: about 1/128 of the tier moves toward the
  // pressed pool group (pages above the donor's new end move within the tier; ACTIVE caches'
  // tables follow). Returns whether anything moved; kFailedPrecondition with rebalancing off.
  Result<bool> adjust();
  // --- eviction ahead of the next step ---
  // Frees GPU slots before the next step needs them, so that its allocations find them free:
  // evicts pages (moved down a tier or dropped, exactly as an allocation would) until pool
  // group g of the GPU tier has free_slots[g] free slots, or max_evictions pages went, or
  // nothing is left to evict. Call it while the GPU computes a step (off the step's critical
  // path); like every call, its decisions depend only on the calls before it. First it does
  // the tree's upkeep that evictions inside the steps left for later (a dropped snapshot's walk
  // up its path: the demotion of the KV run it served and the pruning of the emptied nodes; at
  // most 64 wait, the oldest is done when one more comes). Returns the pages evicted;
  // kInvalidArgument (changing nothing) when free_slots does not have one entry per pool group.
  Result<uint64_t> evict_ahead(std::span<const uint64_t> free_slots, uint64_t max_evictions);
  // A request waits in the engine's queue: every tree page create_kv_cache would reuse of its
  // prompt becomes the most recent in its eviction queue, as if a request had just used and
  // released it, so that the traffic admitted before it does not evict its prefix first (the
  // scheduler knows what comes next; LRU alone does not). Takes no reference and counts no
  // lookup: the pages stay evictable, only later. Between steps, like evict_ahead. `keys`:
  // hash_prompt's for this prompt, or null (hashed here); kInvalidArgument (changing nothing)
  // when they were computed for another prompt. Returns what create_kv_cache would reuse now.
  Result<ReuseMatch> touch_reuse(const ReuseScope& scope, std::span<const int32_t> tokens,
                                 const PromptKeys* keys = nullptr,
                                 std::span<const MultimodalItem> multimodal = {});
  // Refused (kFailedPrecondition) while caches are open.
  [[nodiscard]] Status shutdown();

  // --- the shared tier (ManagerConfig::shared; kFailedPrecondition without one) ---
  // Brings the prompt's blocks that the local tree lacks from the store into it, as far as the
  // hybrid rule allows (the KV chain complete and a snapshot at its end for every recurrent
  // group), onto the first tier below the GPU the CPU reaches (else the GPU); call it before
  // create() so that the match finds them. The store's round trips run outside the manager's
  // lock; a store that fails or holds a corrupt object (deleted) costs a miss, never a wrong
  // byte. kOutOfPages when that tier has no room for the fetched pages (nothing changed).
  Result<SharedFetch> fetch_shared(const ReuseScope& scope, std::span<const int32_t> tokens);
  // The same fetch on the shared tier's own thread (fetches run one at a time, in the order
  // asked), as a prefetch: the engine keeps serving and creates the request once the future is
  // ready. The tokens are copied. A fetch the manager's end finds not started answers
  // kFailedPrecondition; kFailedPrecondition at once without a shared tier.
  std::future<Result<SharedFetch>> fetch_shared_async(const ReuseScope& scope,
                                                      std::span<const int32_t> tokens);
  SharedTierStats shared_stats() const;
  // Returns once every committed object queued for the store has been written (or failed).
  void flush_shared();

  // --- memory the engine owns (BackendKind::kEngine; kFailedPrecondition on the others) ---
  // The copies submitted since the last take, oldest batch first (hybridkv/engine_memory.h).
  // Pages they write are read only after the engine reports them done.
  Result<std::vector<EngineCopyBatch>> take_copies();
  // The engine ran every batch up to `event` (an event never submitted is refused).
  Status copies_done(CopyEvent event);

  // Blocks until every copy up to `event` has completed (kEngine: an attached EngineMemory may
  // run them on this thread, else until the engine reports them done).
  void wait(CopyEvent event);
  // Makes the engine's `stream` wait for every copy up to `event` on every rank (CUDA backend:
  // on the device, the host does not block); backends without streams block until it completes.
  void stream_wait(Stream stream, CopyEvent event);
  // The first copy that failed (a DISK tier write or read), or ok. A page whose write failed is
  // never read as valid: its reader gets 0xff bytes and this status says which.
  Status copy_status() const;
  BackendKind backend_kind() const;
  // Blocks until every copy submitted so far has completed.
  void synchronize() { wait(CopyEvent{UINT64_MAX}); }
  // Tensor-parallel ranks whose pools this manager holds (BackendOptions::devices; 1 else).
  // One set of tables serves them all: a slot index names the same page on every rank.
  uint32_t ranks() const;
  // Address of slot `slot` of pool `pool` of a pool group on a tier, in rank `rank`'s memory
  // (nullptr: none backend, or no such rank).
  std::byte* slot_address(TierKind tier, PoolGroupId pool_group, uint32_t pool, uint32_t slot,
                          uint32_t rank = 0) const;
  // Sets every byte of each span of pool memory (of any rank) to `value`, ordered on `stream`
  // (CUDA: one batched kernel per rank, on the engine's stream where it is that rank's device;
  // elsewhere at once).
  void fill(std::span<const std::span<std::byte>> spans, uint8_t value, Stream stream = {});
  // Index of the first NaN/Inf element of each span of pool memory read as its dtype, or
  // UINT64_MAX (CUDA: one batched kernel). Requires: the spans' copies completed.
  std::vector<uint64_t> scan_non_finite(std::span<const std::span<const std::byte>> spans,
                                        std::span<const DType> dtypes) const;

 private:
  friend struct cache_detail::CoreAccess;  // the implementation's own layers (cache/)
  explicit KvCacheManager(std::shared_ptr<cache_detail::ManagerCore> core);
  std::shared_ptr<cache_detail::ManagerCore> core_;
};

}  // namespace hybridkv
