// Manager configuration: the value structs an engine fills in to describe its cache.
//
// A ManagerConfig lists the model's cache layers (attention and SSM/recurrent), the buffers each
// layer keeps per page, the memory tiers with their byte quotas, and the knobs of reuse and
// sizing. Everything is a plain value with a default; `validate_config` reports every problem at
// once, each naming the field and the value ("attention_layers[2] (layer 7): window 0 must be
// > 0"). Nothing here allocates memory: the StoragePlan (plan.h) turns a config into pools.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridkv/status.h"

namespace hybridkv {

using LayerId = int32_t;

// Who may share a buffer's pages (DESIGN §2).
enum class ReusePolicy : uint8_t {
  kRequired = 0,  // published on commit; a prefix match counts only as far as it can be restored
  kOptional = 1,  // published; does not shorten a match; chosen per request at the first resume
  kPrivate = 2,   // request-local; never published, never matched
};
const char* reuse_policy_name(ReusePolicy policy);  // "REQUIRED", "OPTIONAL", "PRIVATE"
std::optional<ReusePolicy> parse_reuse_policy(std::string_view text);

// Element types, used to check page sizes and, later, to scan buffers for NaN/Inf.
enum class DType : uint8_t { kF32, kF16, kBF16, kFP8E4M3, kFP8E5M2, kINT8, kUINT8 };
const char* dtype_name(DType dtype);                      // "fp32", "fp16", "bf16", "fp8_e4m3", ...
uint32_t dtype_size(DType dtype);                         // bytes per element
std::optional<DType> parse_dtype(std::string_view text);  // accepts torch names too ("float32")

// Memory tiers, warmest first.
enum class TierKind : uint8_t { kGpu = 0, kHost = 1, kDisk = 2 };

// How prefix-tree block keys are hashed. SHA-256 is collision-resistant (the default); the fast
// hash is a 256-bit non-cryptographic mix, only for callers that accept collision risk.
enum class BlockHash : uint8_t { kSha256, kFastNonCryptographic };
const char* tier_kind_name(TierKind kind);  // "GPU", "HOST", "DISK"

struct BufferConfig {
  std::string role;             // "key", "value", "ssm_state", "conv_state", ...
  uint64_t bytes_per_page = 0;  // one token block (attention) or one state (SSM); 0 = dropped
  std::optional<ReusePolicy> reuse_policy;  // unset: inherit the layer's policy
  std::optional<DType> dtype;  // optional; bytes_per_page must be a multiple of its size
};

struct AttentionLayerConfig {
  LayerId id = 0;
  std::optional<uint32_t> window;       // sliding window in tokens; unset = full attention
  std::optional<uint32_t> sink_tokens;  // attention sinks kept forever; needs a window
  ReusePolicy reuse_policy = ReusePolicy::kRequired;
  std::vector<BufferConfig> buffers;
};

struct SsmLayerConfig {
  LayerId id = 0;
  ReusePolicy reuse_policy = ReusePolicy::kRequired;
  std::vector<BufferConfig> buffers;
};

struct TierConfig {
  TierKind kind = TierKind::kGpu;
  uint64_t quota_bytes = 0;
  std::string path;  // DISK only: the directory that holds the tier's files
  // The most KvCacheManager::set_quota may grow this tier to (0: quota_bytes). The backend
  // reserves the pools for it at construction (host memory is touched only when used).
  uint64_t max_quota_bytes = 0;
};

// One request of a batch shape: `capacity` tokens of KV in use after the step, of which
// `history` tokens were already computed before it (history <= capacity).
struct RequestShape {
  uint64_t capacity = 0;
  uint64_t history = 0;
};

// A batch of requests that run in one step. `shared_prefix_tokens` is a system prompt that
// every request of the batch shares (its full blocks are stored once).
struct BatchShape {
  std::vector<RequestShape> requests;
  std::optional<uint64_t> shared_prefix_tokens;
};

// The manager's policies, each chosen by one field: declared once, used by KvCacheManager
// (ManagerConfig::policies) and HybridCacheManager (ServingConfig::policies). Each named
// policy has one home in the library (src/storage/eviction_policy.h, offload_policy.h; the
// rebalancer in src/cache/rebalance.cc), where more can be registered.
struct PolicyConfig {
  // Which page a full tier gives up first:
  //  - "priced" (default): with a REQUIRED SSM group, tree pages no request can resume from
  //    are demoted (evicted first), and each snapshot ages in its queue as fast as it is cheap,
  //    by tokens of recompute saved per byte (its depth against its bytes and the KV under it,
  //    times whether it served a resume, or the credit of a conversation's next turn); the KV
  //    run above a snapshot ages with it;
  //  - "snapshot-aware": demotion only, every page ages alike;
  //  - "lru": (priority, LRU), as an attention-only cache.
  std::string eviction = "priced";
  // Whether a DROPPABLE page evicted from a tier goes down to the next one: "selective"
  // (default: only when it is worth the bus: not demoted by the prefix index), "all", or
  // "room" (selective while the tier below is full; while it has a free slot, every page).
  std::string offload = "selective";
  // A tree page onboarded from a colder tier leaves its bytes there as a copy (tree pages never
  // change): evicting the page again goes back to the copy with no transfer. Copies are the
  // colder tier's first victims, so they only use room nothing else needs. false: every onboard
  // frees the colder slot and every later eviction copies the page down again.
  bool keep_colder_copies = true;
  // Pool rebalancing: "off" (default: the split the plan started from), or "pressure": one
  // budget per tier, the pool groups trade slots while serving (KvCacheManager::
  // need_adjustment / adjust) toward the group whose next victim is youngest. Each elastic pool
  // group reserves room for the whole tier (address space; the host backend touches only what
  // is used).
  std::string rebalance = "off";
  bool rebalancing() const { return rebalance != "off"; }
  // Where the tree's upkeep after a snapshot dropped to make room goes (its walks up the path:
  // demoting the KV run it served, promoting the snapshot it superseded, pruning the emptied
  // nodes; tens of microseconds on long paths of small pages): false (default), in the call
  // that dropped it; true, between steps, in KvCacheManager::evict_ahead, which the engine then
  // calls between every two steps (at most 64 drops wait; one more does the oldest). Until then
  // the KV run counts as resumable, which changes which pages later evictions take.
  bool upkeep_between_steps = false;
};

class SharedStore;

// The tier shared by every serving instance (DESIGN §8a), in a store such as Redis
// (hybridkv/shared_store.h: open_redis_store). Committed full blocks and their SSM snapshots are
// published to it in the background (a step never waits for the store); fetch_shared() brings a
// prompt's blocks from it into the local tree as far as the hybrid rule allows: the KV chain
// complete and a snapshot at its end for every recurrent group.
struct SharedTierConfig {
  std::shared_ptr<SharedStore> store;      // null: no shared tier
  std::string model_id;                    // names the model and weights: part of every key
  uint32_t rank = 0;                       // tensor-parallel rank: each rank shares its own slice
  uint32_t max_queued_objects = 4096;      // objects waiting to be written; more are dropped
  uint64_t max_queued_bytes = 1ull << 30;  // their bytes (host memory); more are dropped
  uint32_t max_lookup_blocks = 1024;       // blocks of a prompt looked up in the store at most
  // A fetch that would take longer than computing its tokens is skipped: the engine's prefill
  // rate (tokens per second; 0: never skip) against the store's rate (bytes per second;
  // bench/shared_store_bench measures it: about 1.5e9 on loopback, 2 vCPUs).
  double prefill_tokens_per_s = 0;
  double fetch_bytes_per_s = 1.5e9;
};

struct ManagerConfig {
  // --- model ---
  uint32_t tokens_per_block = 32;  // tokens per attention page
  std::vector<AttentionLayerConfig> attention_layers;
  std::vector<SsmLayerConfig> ssm_layers;

  // --- memory ---
  std::vector<TierConfig> tiers;      // warmest first; the first must be GPU
  double max_util_for_resume = 0.97;  // resume refused above this GPU pool utilization; (0, 1]
  std::optional<uint32_t> max_live_kv_caches;  // bound on active + suspended caches
  // The policies: eviction, offload admission, kept copies, rebalancing (PolicyConfig).
  PolicyConfig policies;
  // Reduced-precision snapshots (opt-in): SSM snapshots in the prefix tree keep their fp32
  // buffers in this dtype while live states stay fp32, converted on the copies between them:
  // kBF16 (half the bytes), or kFP8E4M3 (blocks of 128 e4m3 values with a power-of-two scale
  // each: 129 bytes per 512). The snapshots get a pool group of their own
  // (PoolGroup::snapshots_of).
  std::optional<DType> snapshot_dtype;

  // --- reuse ---
  bool enable_block_reuse = true;     // false: nothing is published; SSM pools at the live floor
  bool commit_min_snapshot = false;   // commits publish partial tails and SSM state at their end
  bool enable_partial_reuse = false;  // a match may end inside a block (the tail is copied)
  uint32_t reuse_match_backoff = 0;   // tokens trimmed off every match
  BlockHash block_hash = BlockHash::kSha256;  // block keys of the prefix tree
  bool record_events = false;  // keep tree events (stored / removed / updated) for take_events()

  // --- sliding-window scratch (seeds 002, 004) ---
  // During a long prefill, window blocks that go stale within the same step get no persistent
  // page: they map onto a few scratch slots per request, shared by all layers of the group
  // (KvCache::scratch). A per-request switch (CacheOptions::swa_scratch) when on here.
  bool swa_scratch_reuse = false;
  // Tokens at the end of a step that the engine may rewind (rejected speculative drafts): the
  // blocks they need are never scratch. >= 0 and at most the longest request the GPU holds.
  int64_t max_rewind_len = 0;

  // --- pool sizing (first one set wins: pool_ratio, typical_step, constraints, default batch) ---
  std::optional<std::vector<double>> pool_ratio;  // one byte share per pool group
  std::optional<BatchShape> typical_step;         // the step the pools are shaped for
  std::vector<BatchShape> constraints;            // batches that must always fit on the GPU

  // --- the shared tier (off unless shared.redis is set) ---
  SharedTierConfig shared;
};

// The batch used to shape pools when no ratio, typical step or constraint is given:
// 32 decoding requests of 2048 tokens each.
BatchShape default_typical_step();

// Every problem with `config`, one message each, naming the field and the value: the first 20,
// then one message counting the rest. Empty = valid.
std::vector<std::string> config_errors(const ManagerConfig& config);
// OK, or kInvalidArgument with every problem of config_errors joined by "; ".
Status validate_config(const ManagerConfig& config);

}  // namespace hybridkv
