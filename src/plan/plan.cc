#include "hybridkv/plan.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hybridkv/units.h"
#include "plan/plan_internal.h"

namespace hybridkv {

using plan_detail::Structure;

namespace {

// With rebalancing every elastic pool group may grow to the whole tier.
void reserve_whole_tier(const std::vector<PoolGroup>& groups, const TierConfig& config,
                        TierPlan& tier) {
  const uint64_t most = std::max<uint64_t>(
      tier.quota, plan_detail::round_to_grain(config.kind, config.max_quota_bytes));
  for (const PoolGroup& pg : groups) {
    if (pg.fixed_private || pg.live_floor || pg.slot_bytes == 0) continue;
    uint64_t& r = tier.reserved_slots[pg.id.value];
    r = std::max(r, most / pg.slot_bytes);
  }
}

// Slot indices reach kernels as int32 (block tables, state indices; -1 is "no page"): a pool
// group of a tier holds at most 2^31 - 1 slots.
Status check_slot_range(const TierConfig& config, const TierPlan& tier, size_t index) {
  constexpr uint64_t kMaxSlots = (1ull << 31) - 1;
  for (size_t pg = 0; pg < tier.reserved_slots.size(); ++pg) {
    if (tier.reserved_slots[pg] <= kMaxSlots) continue;
    const uint64_t bytes = std::max(config.quota_bytes, config.max_quota_bytes);
    return Status::invalid("tiers[" + std::to_string(index) + "] (" + tier_kind_name(config.kind) +
                           "): quota " + format_bytes(bytes) + " gives pool group " +
                           std::to_string(pg) + " " + std::to_string(tier.reserved_slots[pg]) +
                           " slots; slot indices are int32, at most " + std::to_string(kMaxSlots) +
                           " slots per pool group: lower the quota or raise tokens_per_block");
  }
  return Status::ok();
}

}  // namespace

Result<StoragePlan> StoragePlan::build(const ManagerConfig& config) {
  Result<Structure> structure = plan_detail::build_structure(config);
  if (!structure) return structure.status();
  StoragePlan plan;
  plan.config_ = config;
  plan.groups_ = std::move(structure->groups);
  plan.buffers_ = std::move(structure->buffers);
  plan.pool_groups_ = std::move(structure->pool_groups);
  const plan_detail::StructureView view{plan.groups_, plan.pool_groups_};

  for (const TierConfig& t : config.tiers) {
    TierPlan tier;
    tier.kind = t.kind;
    tier.requested_quota = t.quota_bytes;
    tier.quota = plan_detail::round_to_grain(t.kind, t.quota_bytes);
    if (t.kind == TierKind::kGpu) {
      const uint64_t minimum = plan_detail::minimum_gpu_bytes(view);
      if (tier.quota < minimum) {
        tier.quota = plan_detail::round_to_grain(TierKind::kGpu, minimum);
        tier.quota_raised = true;
        plan.notes_.push_back("GPU quota raised from " + format_bytes(t.quota_bytes) + " to " +
                              format_bytes(tier.quota) + ": the pool-group floors need " +
                              format_bytes(minimum));
      }
    }
    tier.grain = tier_grain(t.kind, tier.quota);
    plan_detail::TierSplit split = plan_detail::split_tier(config, view, t.kind, tier.quota);
    tier.slots = std::move(split.slots);
    for (std::string& note : split.notes) plan.notes_.push_back(std::move(note));
    for (const PoolGroup& pg : plan.pool_groups_) {
      tier.bytes_used += tier.slots[pg.id.value] * pg.slot_bytes;
    }
    tier.unassigned_bytes = tier.quota > tier.bytes_used ? tier.quota - tier.bytes_used : 0;
    tier.reserved_slots = tier.slots;
    if (t.max_quota_bytes > tier.quota) {
      const std::vector<uint64_t> most =
          plan_detail::split_tier(config, view, t.kind,
                                  plan_detail::round_to_grain(t.kind, t.max_quota_bytes))
              .slots;
      for (size_t i = 0; i < most.size(); ++i)
        tier.reserved_slots[i] = std::max(tier.reserved_slots[i], most[i]);
    }
    if (config.policies.rebalancing()) reserve_whole_tier(plan.pool_groups_, t, tier);
    if (Status s = check_slot_range(t, tier, plan.tiers_.size()); !s) return s;
    plan.tiers_.push_back(std::move(tier));
  }
  const std::optional<uint64_t> longest = plan.max_request_tokens();
  if (longest && config.max_rewind_len > 0 &&
      static_cast<uint64_t>(config.max_rewind_len) > *longest) {
    return Status::invalid("max_rewind_len " + std::to_string(config.max_rewind_len) +
                           " is beyond the longest request the GPU tier holds (" +
                           std::to_string(*longest) + " tokens)");
  }
  return plan;
}

Result<const PlannedBuffer*> StoragePlan::find_buffer(LayerId layer, std::string_view role) const {
  for (const PlannedBuffer& b : buffers_) {
    if (b.layer == layer && b.role == role) return &b;
  }
  return Status::not_found("buffer (layer " + std::to_string(layer) + ", role '" +
                           std::string(role) + "') is not in the plan (unknown, or zero-size)");
}

Result<CacheGroupId> StoragePlan::buffer_group_id(LayerId layer, std::string_view role) const {
  Result<const PlannedBuffer*> b = find_buffer(layer, role);
  if (!b) return b.status();
  return (*b)->group;
}

std::vector<std::vector<BufferKey>> StoragePlan::buffer_grouping() const {
  std::vector<std::vector<BufferKey>> out(groups_.size());
  for (const CacheGroup& g : groups_) {
    for (uint32_t b : g.buffers) out[g.id.value].push_back({buffers_[b].layer, buffers_[b].role});
  }
  return out;
}

Result<CacheGroupId> StoragePlan::layer_group_id(LayerId layer) const {
  std::vector<CacheGroupId> found;
  for (const PlannedBuffer& b : buffers_) {
    if (b.layer == layer && std::find(found.begin(), found.end(), b.group) == found.end()) {
      found.push_back(b.group);
    }
  }
  if (found.empty()) {
    return Status::not_found("layer " + std::to_string(layer) +
                             " is not in the plan (unknown, or all its buffers are zero-size)");
  }
  if (found.size() > 1) {
    std::string groups;
    for (CacheGroupId g : found) groups += (groups.empty() ? "" : ", ") + std::to_string(g.value);
    return Status::invalid("layer " + std::to_string(layer) + " is split across cache groups " +
                           groups + "; use buffer_group_id(layer, role)");
  }
  return found.front();
}

std::vector<std::vector<LayerId>> StoragePlan::layer_grouping() const {
  std::vector<std::vector<LayerId>> out(groups_.size());
  for (const CacheGroup& g : groups_) out[g.id.value] = g.layers;
  return out;
}

Result<BufferAddress> StoragePlan::buffer_address(LayerId layer, std::string_view role,
                                                  IndexMode mode) const {
  Result<const PlannedBuffer*> found = find_buffer(layer, role);
  if (!found) return found.status();
  const PlannedBuffer& b = **found;
  const Pool& pool = pool_groups_[b.pool_group.value].pools[b.pool];
  BufferAddress a;
  a.pool_group = b.pool_group;
  a.pool = b.pool;
  a.stride = b.size;
  a.scale = static_cast<int64_t>(pool.slot_bytes / b.size);
  if (mode == IndexMode::kShared) {
    a.base_offset = b.offset;
    a.index_offset = 0;
  } else {
    a.base_offset = 0;
    a.index_offset = static_cast<int64_t>(b.offset / b.size);
  }
  return a;
}

Status StoragePlan::convert_page_indices(LayerId layer, std::string_view role, IndexMode mode,
                                         std::span<const int32_t> slots, std::span<int32_t> out,
                                         const ScratchDesc* scratch) const {
  if (out.size() != slots.size()) {
    return Status::invalid("convert_page_indices: out has " + std::to_string(out.size()) +
                           " entries for " + std::to_string(slots.size()) + " slots");
  }
  Result<BufferAddress> a = buffer_address(layer, role, mode);
  if (!a) return a.status();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 && slots[i] != kBadPageIndex) {
      return Status::invalid("convert_page_indices: slot " + std::to_string(slots[i]) +
                             " at position " + std::to_string(i) + " is negative");
    }
    const int64_t index = a->page_index(slots[i]);
    if (index > INT32_MAX) {
      return Status::invalid("convert_page_indices: page index " + std::to_string(index) +
                             " of slot " + std::to_string(slots[i]) + " does not fit in int32");
    }
    out[i] = static_cast<int32_t>(index);
  }
  if (scratch == nullptr || scratch->num_blocks == 0) return Status::ok();
  return convert_scratch(layer, role, mode, *scratch, out);
}

Status StoragePlan::convert_scratch(LayerId layer, std::string_view role, IndexMode mode,
                                    const ScratchDesc& scratch, std::span<int32_t> out) const {
  const std::string what = "convert_page_indices (layer " + std::to_string(layer) + ", role '" +
                           std::string(role) + "') with a scratch descriptor";
  const PlannedBuffer& b = **find_buffer(layer, role);
  if (b.scratch_pages_per_block == 0) {
    return Status::invalid(what + ": the buffer is not in a sliding-window group");
  }
  if (mode != IndexMode::kPerLayer) {
    return Status::invalid(what +
                           ": scratch blocks need IndexMode::kPerLayer (a SHARED base is "
                           "offset per layer, scratch pages are shared by the layers)");
  }
  const int64_t scale = (*buffer_address(layer, role, mode)).scale;
  const uint64_t pages = scratch.num_blocks * b.scratch_pages_per_block;
  if (pages > scratch.slots.size() * static_cast<uint64_t>(scale) ||
      scratch.first_block + scratch.num_blocks > out.size()) {
    return Status::invalid(what + ": " + std::to_string(scratch.num_blocks) + " blocks from " +
                           std::to_string(scratch.first_block) + " need " + std::to_string(pages) +
                           " pages; the descriptor has " + std::to_string(scratch.slots.size()) +
                           " slots of " + std::to_string(scale) + " for a table of " +
                           std::to_string(out.size()));
  }
  for (uint64_t j = 0; j < scratch.num_blocks; ++j) {
    const uint64_t q = j * b.scratch_pages_per_block + b.scratch_page;
    const int64_t index =
        int64_t{scratch.slots[q / scale]} * scale + static_cast<int64_t>(q % scale);
    if (index > INT32_MAX) return Status::invalid(what + ": page index beyond int32");
    out[scratch.first_block + j] = static_cast<int32_t>(index);
  }
  return Status::ok();
}

Result<int64_t> StoragePlan::page_index_upper_bound(LayerId layer, std::string_view role,
                                                    TierKind kind) const {
  Result<BufferAddress> a = buffer_address(layer, role, IndexMode::kShared);
  if (!a) return a.status();
  const TierPlan* t = tier(kind);
  const uint64_t reserved = t == nullptr ? 0 : t->reserved_slots[a->pool_group.value];
  return static_cast<int64_t>(reserved) * a->scale;
}

const TierPlan* StoragePlan::tier(TierKind kind) const {
  for (const TierPlan& t : tiers_) {
    if (t.kind == kind) return &t;
  }
  return nullptr;
}

uint64_t StoragePlan::slots(TierKind kind, PoolGroupId pool_group) const {
  const TierPlan* t = tier(kind);
  if (t == nullptr || pool_group.value >= t->slots.size()) return 0;
  return t->slots[pool_group.value];
}

}  // namespace hybridkv
