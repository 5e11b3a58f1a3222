// Internal steps of StoragePlan::build, shared by build() and the sizing functions so that every
// path counts the same slots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridkv/plan.h"

namespace hybridkv::plan_detail {

// The largest quota any tier may have: keeps every byte product below 2^63.
inline constexpr uint64_t kMaxQuotaBytes = 1ull << 60;

// What slot counting reads: the cache groups and pool groups (with floors), borrowed.
struct StructureView {
  const std::vector<CacheGroup>& groups;
  const std::vector<PoolGroup>& pool_groups;
};

// Groups, buffers and pool groups of a config, with floors; no tiers.
struct Structure {
  std::vector<CacheGroup> groups;
  std::vector<PlannedBuffer> buffers;
  std::vector<PoolGroup> pool_groups;
  operator StructureView() const { return {groups, pool_groups}; }  // NOLINT: a borrow
};

// groups.cc: buffers -> cache groups (ids assigned), buffers in slot order within each group.
void build_groups(const ManagerConfig& config, Structure& s);
// layout.cc: pools, offsets, pool groups.
void build_layout(const ManagerConfig& config, Structure& s);
// slots.cc: floors, and the whole structure from a validated config.
Result<Structure> build_structure(const ManagerConfig& config);

// Requests that live at once: max_live_kv_caches, else the largest declared batch, else the
// default batch.
uint64_t live_requests(const ManagerConfig& config);
// Slots a request of this shape needs in one group (see DESIGN §3.4).
uint64_t request_demand(const ManagerConfig& config, const CacheGroup& group,
                        const RequestShape& request);
// Slots a whole batch needs in one group, shared-prefix blocks counted once.
uint64_t batch_demand(const ManagerConfig& config, const CacheGroup& group,
                      const BatchShape& batch);
// ceil(slots / util) with one floating-point type everywhere (DESIGN §3.6).
uint64_t scale_by_util(uint64_t slots, double util);

// The slots of every pool group on one tier at a quota already rounded to the grain.
struct TierSplit {
  std::vector<uint64_t> slots;
  bool feasible = true;            // the GPU floors and fixed pools fit
  std::vector<std::string> notes;  // floors that overrode the ratio
};
TierSplit split_tier(const ManagerConfig& config, const StructureView& s, TierKind kind,
                     uint64_t quota);
// Bytes of every GPU floor and fixed pool (before rounding to the grain).
uint64_t minimum_gpu_bytes(const StructureView& s);
// Rounds up to the tier's grain.
uint64_t round_to_grain(TierKind kind, uint64_t quota);

}  // namespace hybridkv::plan_detail

namespace hybridkv::plan_detail {

// The most requests' slots usable at util: the largest u with scale_by_util(u, util) <= slots.
uint64_t usable_slots(uint64_t slots, double util);
// See StoragePlan::gpu_kv_tokens / max_request_tokens; `slots` are GPU slots per pool group.
std::optional<uint64_t> kv_tokens(const ManagerConfig& config, const StructureView& s,
                                  const std::vector<uint64_t>& slots);
std::optional<uint64_t> longest_request(const ManagerConfig& config, const StructureView& s,
                                        const std::vector<uint64_t>& slots);
// The longest request such that `batch` of them are ACTIVE together (0: the batch does not fit
// at all; nullopt: no full attention bounds the length).
std::optional<uint64_t> longest_request_in_batch(const ManagerConfig& config,
                                                 const StructureView& s,
                                                 const std::vector<uint64_t>& slots,
                                                 uint64_t batch);

}  // namespace hybridkv::plan_detail
