// StoragePlan: from a ManagerConfig to cache groups, pools, pool groups and slot counts.
//
// The plan is pure: it owns no memory and can be built for any quota. It answers
//  - which cache group every (layer, role) buffer belongs to (DESIGN §2): buffers are grouped
//    by effective reuse policy (a buffer's own, else its layer's) and, for attention, by window
//    and sink blocks; zero-size buffers are dropped. Group ids are deterministic: SSM groups
//    first (REQUIRED, OPTIONAL, PRIVATE), then full attention, then windows by increasing size,
//    then sinks, then policy.
//  - how every group's slot is laid out (§3.2): equal-size buffers of a group form a pool; the
//    group's slot is the list of its pool slot sizes (descending); groups with identical lists
//    share a pool group (one slot id space). The fixed PRIVATE pool (max_live_kv_caches) is
//    always a pool group of its own.
//  - what kernels are told (§3.3): a buffer's page at slot s lives at
//    base + index * stride with stride = buffer size; SHARED mode: base = pool base + offset,
//    index = s * scale; PER_LAYER mode: base = pool base, index = s * scale + offset / size;
//    scale = pool slot bytes / buffer size.
//  - how many slots each pool group gets on each tier (§3.4–3.7): see slot_counts() below.
//
// Thread-safety: immutable after build(); all const methods may be called from any thread.
// Cost: build() is linear in the number of buffers plus a few passes over pool groups.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/ids.h"
#include "hybridkv/status.h"

namespace hybridkv {

inline constexpr int32_t kBadPageIndex = -1;  // a block with no resident page

enum class GroupKind : uint8_t { kAttention, kSsm };
enum class IndexMode : uint8_t {
  kShared,    // one index list for all layers of a group: index = slot * scale
  kPerLayer,  // base is the pool base: index = slot * scale + offset / size
};

struct BufferKey {
  LayerId layer = 0;
  std::string role;
  bool operator==(const BufferKey&) const = default;
};

struct PlannedBuffer {
  LayerId layer = 0;
  std::string role;
  ReusePolicy policy = ReusePolicy::kRequired;  // effective policy
  std::optional<DType> dtype;
  CacheGroupId group;
  PoolGroupId pool_group;
  uint32_t pool = 0;    // index into the pool group's pools
  uint64_t offset = 0;  // bytes from the start of the pool's slot
  uint64_t size = 0;    // bytes per page
  // SWA scratch (window groups): this buffer's page within its layer's share of a scratch
  // block, and the pages that share takes (ScratchPool::pages_per_block).
  uint32_t scratch_page = 0;
  uint32_t scratch_pages_per_block = 0;
  // Reduced-precision snapshots (SSM groups with CacheGroup::snapshot_pool_group): where and in
  // what dtype a snapshot keeps this buffer (snapshot_size 0: no snapshot pool group).
  uint32_t snapshot_pool = 0;
  uint64_t snapshot_offset = 0;
  uint64_t snapshot_size = 0;
  std::optional<DType> snapshot_dtype;
};

// One pool of a window group as SWA scratch sees it: a scratch block of ONE layer takes
// pages_per_block pages of the pool (the most buffers a layer has in it); a slot holds
// pages_per_slot (the pool's buffers per slot), so a block may cross two scratch slots.
struct ScratchPool {
  uint32_t pages_per_block = 0;
  uint32_t pages_per_slot = 0;
};

// The scratch slots of one cache for one window group in the current step (KvCache::scratch):
// blocks [first_block, first_block + num_blocks) report kBadPageIndex in the block table and
// live, shared by every layer of the group, in these GPU slots.
struct ScratchDesc {
  uint64_t first_block = 0;
  uint64_t num_blocks = 0;
  std::vector<int32_t> slots;
  bool contains(uint64_t block) const {
    return block >= first_block && block - first_block < num_blocks;
  }
};

struct CacheGroup {
  CacheGroupId id;
  GroupKind kind = GroupKind::kAttention;
  ReusePolicy policy = ReusePolicy::kRequired;
  std::optional<uint32_t> window;    // attention only
  uint32_t sink_blocks = 0;          // attention only: ceil(sink_tokens / tokens_per_block)
  std::vector<LayerId> layers;       // ascending, each once
  std::vector<uint32_t> buffers;     // indices into StoragePlan::buffers(), in slot order
  std::vector<uint64_t> slot_sizes;  // pool slot bytes, descending
  PoolGroupId pool_group;
  // SSM groups with ManagerConfig::snapshot_dtype: the pool group of the tree's snapshots (live
  // states stay in pool_group).
  std::optional<PoolGroupId> snapshot_pool_group;
  // The pool group a page of this group lives in: snapshots (tree pages) may have their own.
  PoolGroupId page_pool_group(bool snapshot) const {
    return snapshot && snapshot_pool_group ? *snapshot_pool_group : pool_group;
  }
  // Slots one request needs at worst (unscaled): 1 for full attention and SSM; for a window of
  // w tokens the most blocks w consecutive tokens touch (ceil((w - 1) / tpb) + 1) plus sinks.
  uint64_t one_request_slots = 0;
  std::vector<ScratchPool> scratch;  // window groups: per pool of the group's slot

  // Scratch slots that `blocks` scratch blocks of one cache take (0 without a window).
  uint64_t scratch_slots(uint64_t blocks) const {
    uint64_t slots = 0;
    for (const ScratchPool& p : scratch) {
      if (p.pages_per_slot == 0) continue;
      const uint64_t pages = blocks * p.pages_per_block;
      slots = std::max<uint64_t>(slots, (pages + p.pages_per_slot - 1) / p.pages_per_slot);
    }
    return slots;
  }

  // The first token that a step computing tokens from `history` on reads: a window of w tokens
  // is the current token and the w - 1 before it (the HuggingFace and TensorRT-LLM convention),
  // so token history - (w - 1) (0 before that, and 0 without a window). Sink blocks below it are
  // live as well. The one home of the window rule (DESIGN §3.4).
  uint64_t first_live_token(uint64_t history) const {
    return window && history + 1 > *window ? history + 1 - *window : 0;
  }
  uint64_t first_live_block(uint64_t history, uint32_t tokens_per_block) const {
    return first_live_token(history) / tokens_per_block;
  }
  // SWA scratch: the blocks [first, second) of a step computing [history, capacity) that are
  // stale once the step ends (less the last `rewind` tokens, which may be rewound) and start at
  // or after history: stale(max(0, capacity - rewind)) ∩ [ceil(history / tpb), ceil(capacity /
  // tpb)), sink blocks excepted. Empty ({b, b}) without a window.
  std::pair<uint64_t, uint64_t> scratch_blocks(uint64_t capacity, uint64_t history, uint64_t rewind,
                                               uint32_t tokens_per_block) const {
    const uint64_t tpb = tokens_per_block;
    const uint64_t begin = std::max<uint64_t>((history + tpb - 1) / tpb, sink_blocks);
    if (!window) return {begin, begin};
    const uint64_t settled = capacity > rewind ? capacity - rewind : 0;
    const uint64_t end =
        std::min<uint64_t>(first_live_block(settled, tokens_per_block), (capacity + tpb - 1) / tpb);
    return {begin, std::max(begin, end)};
  }
  // Is `block` read by a step from `history` on (ignoring capacity)?
  bool block_live(uint64_t block, uint64_t history, uint32_t tokens_per_block) const {
    return block >= first_live_block(history, tokens_per_block) || block < sink_blocks;
  }
};

struct Pool {
  uint64_t buffer_size = 0;  // every buffer of the pool has this many bytes per page
  uint32_t num_buffers = 0;  // buffers per slot (all layers and roles of one member group)
  uint64_t slot_bytes = 0;   // buffer_size * num_buffers
};

// Why a pool group has the floor it has (printed by `hybridkv plan`).
struct FloorReason {
  std::string what;    // "one request", "constraints[0]", "max_live_kv_caches", "live floor"
  uint64_t slots = 0;  // unscaled slots this reason asks for
};

struct PoolGroup {
  PoolGroupId id;
  std::vector<CacheGroupId> groups;
  std::vector<Pool> pools;     // slot_bytes descending
  uint64_t slot_bytes = 0;     // sum over pools: bytes of one slot on any tier
  bool fixed_private = false;  // the max_live_kv_caches PRIVATE SSM pool: exactly floor slots
  // Reduced-precision snapshots of this SSM cache group, and nothing else (groups is empty).
  std::optional<CacheGroupId> snapshots_of;
  bool live_floor = false;   // block reuse off: an SSM pool held at its live floor
  uint64_t floor_slots = 0;  // GPU slots guaranteed: ceil(max(reasons) / max_util_for_resume)
  std::vector<FloorReason> floor_reasons;
};

struct TierPlan {
  TierKind kind = TierKind::kGpu;
  uint64_t requested_quota = 0;  // as configured
  uint64_t grain = 0;            // allocation grain of this tier at this quota
  uint64_t quota = 0;            // requested rounded up to the grain, raised to the minimum
  bool quota_raised = false;     // GPU only: the floors did not fit in the requested quota
  std::vector<uint64_t> slots;   // per pool group id
  // Per pool group: the slots the backend allocates, the most any quota up to the tier's
  // max_quota_bytes gives (= slots without max_quota_bytes). KvCacheManager::set_quota moves
  // the slot counts within them.
  std::vector<uint64_t> reserved_slots;
  uint64_t bytes_used = 0;  // sum of slots * slot_bytes
  // quota - bytes_used: fewer bytes than one slot of the smallest pool group that the ratio
  // splits (rounding leftovers go to the pool groups furthest below their share).
  uint64_t unassigned_bytes = 0;
};

// Where a buffer's pages are, for kernels (see the header comment).
struct BufferAddress {
  PoolGroupId pool_group;
  uint32_t pool = 0;
  uint64_t base_offset =
      0;                // bytes added to the pool's base address (SHARED: offset; PER_LAYER: 0)
  uint64_t stride = 0;  // bytes between consecutive page indices (= buffer size)
  int64_t scale = 0;    // page indices per slot
  int64_t index_offset = 0;  // added to slot * scale (PER_LAYER: offset / size; SHARED: 0)

  // Requires: slot >= 0 or slot == kBadPageIndex (which maps to kBadPageIndex).
  int64_t page_index(int64_t slot) const {
    return slot < 0 ? kBadPageIndex : slot * scale + index_offset;
  }
};

class StoragePlan {
 public:
  // Validates `config` (every error reported) and builds the plan. A GPU quota too small for
  // the floors is raised to the minimum; the plan's notes() say so.
  static Result<StoragePlan> build(const ManagerConfig& config);

  const ManagerConfig& config() const { return config_; }
  const std::vector<CacheGroup>& cache_groups() const { return groups_; }
  const std::vector<PoolGroup>& pool_groups() const { return pool_groups_; }
  const std::vector<PlannedBuffer>& buffers() const { return buffers_; }
  const std::vector<TierPlan>& tiers() const { return tiers_; }
  const std::vector<std::string>& notes() const { return notes_; }
  const CacheGroup& cache_group(CacheGroupId id) const { return groups_.at(id.value); }
  const PoolGroup& pool_group(PoolGroupId id) const { return pool_groups_.at(id.value); }

  // The group of one buffer; kNotFound for an unknown or dropped (zero-size) buffer.
  Result<CacheGroupId> buffer_group_id(LayerId layer, std::string_view role) const;
  // For each cache group (by id), its buffers in slot order.
  std::vector<std::vector<BufferKey>> buffer_grouping() const;
  // The group of a layer whose buffers all sit in one group; an error names the groups of a
  // layer split across several, or says that the layer is unknown.
  Result<CacheGroupId> layer_group_id(LayerId layer) const;
  // For each cache group (by id), the layers with at least one buffer in it.
  std::vector<std::vector<LayerId>> layer_grouping() const;
  Result<const PlannedBuffer*> find_buffer(LayerId layer, std::string_view role) const;

  Result<BufferAddress> buffer_address(LayerId layer, std::string_view role, IndexMode mode) const;
  // Converts slot ids of the buffer's pool group into page indices for `mode`; kBadPageIndex
  // passes through. Requires: out.size() == slots.size(). With a scratch descriptor (SWA
  // scratch, window groups only, kPerLayer only: a SHARED base differs per layer), the blocks
  // of its range map into its scratch slots: scratch block j's page k of this layer is sub-page
  // q = j * pages_per_block + k of the slots, index slots[q / scale] * scale + q % scale, so a
  // layer's pages are distinct while layers share them.
  Status convert_page_indices(LayerId layer, std::string_view role, IndexMode mode,
                              std::span<const int32_t> slots, std::span<int32_t> out,
                              const ScratchDesc* scratch = nullptr) const;
  // One past the largest page index the buffer can have on `tier` (reserved slots * scale: the
  // bound holds at any runtime quota).
  Result<int64_t> page_index_upper_bound(LayerId layer, std::string_view role, TierKind tier) const;

  // Slots of a pool group on a tier; 0 when the tier is not configured.
  uint64_t slots(TierKind tier, PoolGroupId pool_group) const;
  const TierPlan* tier(TierKind kind) const;

  // Tokens of attention KV the GPU tier holds at max_util_for_resume: for every pool group with
  // attention groups, floor(slots * util) / (attention groups in it) blocks; the least of them,
  // times tokens_per_block. nullopt for a model without attention layers.
  std::optional<uint64_t> gpu_kv_tokens() const;
  // The longest single request the GPU tier can hold (full attention bounds it); nullopt when
  // nothing bounds it (no full-attention layer).
  std::optional<uint64_t> max_request_tokens() const;
  // The longest request such that `batch_size` of them are ACTIVE at once on the GPU tier at
  // max_util_for_resume, each with its states and window blocks (0: that batch does not fit at
  // any length; nullopt: no full-attention layer bounds the length).
  std::optional<uint64_t> max_request_tokens(uint64_t batch_size) const;

 private:
  Status convert_scratch(LayerId layer, std::string_view role, IndexMode mode,
                         const ScratchDesc& scratch, std::span<int32_t> out) const;
  ManagerConfig config_;
  std::vector<CacheGroup> groups_;
  std::vector<PoolGroup> pool_groups_;
  std::vector<PlannedBuffer> buffers_;
  std::vector<TierPlan> tiers_;
  std::vector<std::string> notes_;
};

// --- Sizing (DESIGN §3.4–3.7). Every function computes slots the same way as build(). ---

// The allocation grain of a tier at a quota: GPU 2 MiB growing to 32 MiB (quota / 512 rounded
// down to a power of two, clamped); HOST 4 KiB; DISK 2 MiB.
uint64_t tier_grain(TierKind kind, uint64_t quota_bytes);

// Slots per pool group that build() gives `tier` at `quota_bytes` (before any raise).
Result<std::vector<uint64_t>> estimate_slots(const ManagerConfig& config, TierKind tier,
                                             uint64_t quota_bytes);
// The smallest GPU quota (a whole number of grains) that holds every floor and fixed pool.
Result<uint64_t> minimum_gpu_quota(const ManagerConfig& config);
// The smallest GPU quota whose plan holds `max_tokens` tokens of attention KV (gpu_kv_tokens).
Result<uint64_t> quota_for_tokens(const ManagerConfig& config, uint64_t max_tokens);
// The most tokens of attention KV a GPU quota holds (the inverse of quota_for_tokens).
Result<uint64_t> max_tokens_for_quota(const ManagerConfig& config, uint64_t gpu_quota);
// min(max_seq_len, the longest single request the plan at gpu_quota can hold).
Result<uint64_t> clamp_max_seq_len_for_mem(const ManagerConfig& config, uint64_t gpu_quota,
                                           uint64_t max_seq_len);

}  // namespace hybridkv
