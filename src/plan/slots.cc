// Floors and slot counts per tier (DESIGN §3.4–3.6).
#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>
#include <string>

#include "plan/plan_internal.h"
#include "util/check.h"

namespace hybridkv::plan_detail {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Blocks touched by tokens [begin, end), plus the sink blocks the range does not already cover,
// less the scratch blocks [skip_begin, skip_end) (SWA scratch: no persistent page).
uint64_t window_blocks(uint64_t begin, uint64_t end, uint32_t tpb, uint32_t sink_blocks,
                       std::vector<bool>* shared, uint64_t shared_blocks,
                       std::pair<uint64_t, uint64_t> skip = {0, 0}) {
  if (end == 0) return 0;
  const uint64_t first = begin / tpb;
  const uint64_t last = (end - 1) / tpb;
  const uint64_t sinks = std::min<uint64_t>(sink_blocks, first);
  // Blocks [0, sinks) and [first, last]; those below shared_blocks are counted once per batch.
  uint64_t own = 0;
  auto take = [&](uint64_t from, uint64_t to) {  // [from, to)
    if (from >= to) return;
    const uint64_t shared_end = std::min(to, shared_blocks);
    for (uint64_t b = from; b < shared_end; ++b) (*shared)[b] = true;
    own += to - std::max(from, shared_end);
  };
  take(0, sinks);
  if (skip.first < skip.second) {
    take(first, std::max(first, std::min(skip.first, last + 1)));
    take(std::max(first, skip.second), last + 1);
  } else {
    take(first, last + 1);
  }
  return own;
}

}  // namespace

uint64_t scale_by_util(uint64_t slots, double util) {
  // ceil(slots / util), but a quotient within rounding error of an integer is that integer:
  // 19 / 0.95 must be 20 in every path, not 21 (DESIGN §3.6).
  const double q = static_cast<double>(slots) / util;
  const double r = std::round(q);
  if (std::fabs(q - r) <= 1e-9 * std::max(1.0, q)) return static_cast<uint64_t>(r);
  return static_cast<uint64_t>(std::ceil(q));
}

uint64_t live_requests(const ManagerConfig& config) {
  if (config.max_live_kv_caches) return *config.max_live_kv_caches;
  uint64_t live = 0;
  if (config.typical_step) live = config.typical_step->requests.size();
  for (const BatchShape& b : config.constraints) live = std::max<uint64_t>(live, b.requests.size());
  if (live == 0) live = default_typical_step().requests.size();
  return live;
}

uint64_t request_demand(const ManagerConfig& config, const CacheGroup& group,
                        const RequestShape& request) {
  BatchShape one;
  one.requests.push_back(request);
  return batch_demand(config, group, one);
}

uint64_t batch_demand(const ManagerConfig& config, const CacheGroup& group,
                      const BatchShape& batch) {
  if (group.kind == GroupKind::kSsm) return batch.requests.size();  // one state per request
  const uint32_t tpb = config.tokens_per_block;
  // Full blocks of a shared system prompt are stored once (never for PRIVATE groups).
  uint64_t shared_blocks = 0;
  if (batch.shared_prefix_tokens && group.policy != ReusePolicy::kPrivate) {
    shared_blocks = *batch.shared_prefix_tokens / tpb;
  }
  std::vector<bool> shared(shared_blocks, false);
  uint64_t total = 0;
  for (const RequestShape& r : batch.requests) {
    // A step computing tokens [history, capacity) reads, for a window w, tokens from
    // history - (w - 1) on; full attention reads everything.
    // With SWA scratch, blocks that go stale within the step share a few scratch slots.
    std::pair<uint64_t, uint64_t> scratch{0, 0};
    if (config.swa_scratch_reuse) {
      scratch = group.scratch_blocks(r.capacity, r.history,
                                     static_cast<uint64_t>(config.max_rewind_len), tpb);
      total += group.scratch_slots(scratch.second - scratch.first);
    }
    total += window_blocks(group.first_live_token(r.history), r.capacity, tpb, group.sink_blocks,
                           &shared, shared_blocks, scratch);
  }
  return total + static_cast<uint64_t>(std::count(shared.begin(), shared.end(), true));
}

namespace {

// The share of a live-state pool group's planned bytes kept when its snapshots have a pool group
// of their own (reduced-precision snapshots): a sixteenth of the typical batch's states, and on
// the GPU at least its floor (the running batch); the rest goes to the pages that are kept.
// Measured on the conversation trace (bench/RESULTS.md, 2026-12-01).
constexpr double kLiveStateShare = 1.0 / 16;

void compute_floors(const ManagerConfig& config, Structure& s) {
  const double util = config.max_util_for_resume;
  for (PoolGroup& pg : s.pool_groups) {
    pg.floor_reasons.clear();
    uint64_t one_request = 0;
    bool all_ssm = true;
    for (CacheGroupId g : pg.groups) {
      one_request += s.groups[g.value].one_request_slots;
      all_ssm = all_ssm && s.groups[g.value].kind == GroupKind::kSsm;
    }
    pg.floor_reasons.push_back({"one request", one_request});
    for (size_t i = 0; i < config.constraints.size(); ++i) {
      uint64_t need = 0;
      for (CacheGroupId g : pg.groups) {
        need += batch_demand(config, s.groups[g.value], config.constraints[i]);
      }
      pg.floor_reasons.push_back({"constraints[" + std::to_string(i) + "]", need});
    }
    if (pg.snapshots_of) {
      pg.floor_reasons = {{"one snapshot copy", 1}};
    } else if (pg.fixed_private) {
      pg.floor_reasons.push_back({"max_live_kv_caches", *config.max_live_kv_caches});
    } else if (!config.enable_block_reuse && all_ssm) {
      // Without block reuse recurrent groups never hold snapshots: only live requests' states.
      pg.live_floor = true;
      pg.floor_reasons.push_back({"live floor (block reuse off)", live_requests(config)});
    }
    uint64_t floor = 0;
    for (const FloorReason& r : pg.floor_reasons) floor = std::max(floor, r.slots);
    pg.floor_slots = scale_by_util(floor, util);
  }
}

// Byte weights of the ratio split: an explicit pool_ratio, else the demand of the typical step,
// else of the constraints (the most any of them needs), else of the default batch.
std::vector<double> pool_weights(const ManagerConfig& config, const StructureView& s) {
  std::vector<double> weights(s.pool_groups.size(), 0.0);
  if (config.pool_ratio) {
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = (*config.pool_ratio)[i];
    return weights;
  }
  std::vector<BatchShape> batches;
  if (config.typical_step) {
    batches.push_back(*config.typical_step);
  } else if (!config.constraints.empty()) {
    batches = config.constraints;
  } else {
    batches.push_back(default_typical_step());
  }
  for (const PoolGroup& pg : s.pool_groups) {
    uint64_t demand = 0;
    for (const BatchShape& batch : batches) {
      uint64_t need = 0;
      for (CacheGroupId g : pg.groups) need += batch_demand(config, s.groups[g.value], batch);
      // A snapshot pool group is weighed like its group's states: one per request.
      if (pg.snapshots_of) need = batch_demand(config, s.groups[pg.snapshots_of->value], batch);
      demand = std::max(demand, need);
    }
    weights[pg.id.value] =
        static_cast<double>(std::max<uint64_t>(demand, 1)) * static_cast<double>(pg.slot_bytes);
  }
  return weights;
}

// Rounding each share down to whole slots strands bytes; while a slot's worth is unassigned,
// the pool group furthest below its share (in bytes) that it fits takes one more slot. Fixed
// pools take none. Afterwards fewer bytes than the smallest other slot are left.
void give_out_leftover(const StructureView& s, uint64_t quota, const std::vector<bool>& fixed,
                       std::vector<long double>& share, std::vector<uint64_t>& slots) {
  uint64_t used = 0;
  for (const PoolGroup& pg : s.pool_groups) used += slots[pg.id.value] * pg.slot_bytes;
  if (used >= quota) return;
  uint64_t left = quota - used;
  for (;;) {
    std::optional<size_t> best;
    long double best_gap = 0.0L;
    for (const PoolGroup& pg : s.pool_groups) {
      const size_t i = pg.id.value;
      if (fixed[i] || pg.slot_bytes > left) continue;
      const long double gap = share[i] - static_cast<long double>(slots[i] * pg.slot_bytes);
      if (!best || gap > best_gap) {
        best = i;
        best_gap = gap;
      }
    }
    if (!best) return;
    // Whole slots up to the group's share at once (all the rest it fits once it has its share),
    // so tiny slots do not take one pass each.
    const uint64_t bytes = s.pool_groups[*best].slot_bytes;
    uint64_t k = left / bytes;
    if (best_gap > 0.0L) k = std::clamp<uint64_t>(static_cast<uint64_t>(best_gap) / bytes, 1, k);
    slots[*best] += k;
    left -= k * bytes;
  }
}

}  // namespace

Result<Structure> build_structure(const ManagerConfig& config) {
  Status status = validate_config(config);
  if (!status) return status;
  Structure s;
  build_groups(config, s);
  if (s.groups.empty()) {
    return Status::invalid("every buffer of every layer has bytes_per_page 0: nothing to store");
  }
  build_layout(config, s);
  if (config.pool_ratio && config.pool_ratio->size() != s.pool_groups.size()) {
    return Status::invalid("pool_ratio has " + std::to_string(config.pool_ratio->size()) +
                           " entries but the plan has " + std::to_string(s.pool_groups.size()) +
                           " pool groups");
  }
  compute_floors(config, s);
  return s;
}

uint64_t minimum_gpu_bytes(const StructureView& s) {
  uint64_t bytes = 0;
  for (const PoolGroup& pg : s.pool_groups) bytes += pg.floor_slots * pg.slot_bytes;
  return bytes;
}

uint64_t round_to_grain(TierKind kind, uint64_t quota) {
  const uint64_t grain = tier_grain(kind, quota);
  return (quota + grain - 1) / grain * grain;
}

TierSplit split_tier(const ManagerConfig& config, const StructureView& s, TierKind kind,
                     uint64_t quota) {
  TierSplit split;
  const size_t n = s.pool_groups.size();
  split.slots.assign(n, 0);
  std::vector<double> weights = pool_weights(config, s);
  // Snapshots kept in a pool group of their own leave the live states' pool group only the
  // states of running requests (its GPU floor) and of suspended ones to hold.
  for (const PoolGroup& pg : s.pool_groups) {
    if (pg.snapshots_of)
      weights[s.groups[pg.snapshots_of->value].pool_group.value] *= kLiveStateShare;
  }
  std::vector<bool> pinned(n, false);
  uint64_t available = quota;
  if (kind == TierKind::kGpu) {
    if (quota < minimum_gpu_bytes(s)) split.feasible = false;
    for (const PoolGroup& pg : s.pool_groups) {
      if (!pg.fixed_private && !pg.live_floor) continue;
      // Fixed pools come out of the quota before the ratio split and never grow with it.
      pinned[pg.id.value] = true;
      split.slots[pg.id.value] = pg.floor_slots;
      const uint64_t bytes = pg.floor_slots * pg.slot_bytes;
      available = bytes <= available ? available - bytes : 0;
    }
  }
  // Water-filling: split what is left by weight; pool groups whose share falls below their
  // floor take the floor and leave the split (on the GPU tier only).
  std::vector<long double> share(n, 0.0L);
  std::vector<bool> fixed = pinned;  // fixed pools never take leftovers
  for (;;) {
    double total_weight = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (!pinned[i]) total_weight += weights[i];
    }
    if (total_weight <= 0.0) break;
    // Every share of a pass comes from the same `available`; violators are pinned together.
    std::vector<size_t> below_floor;
    for (size_t i = 0; i < n; ++i) {
      if (pinned[i]) continue;
      const PoolGroup& pg = s.pool_groups[i];
      share[i] =
          static_cast<long double>(available) * weights[i] / static_cast<long double>(total_weight);
      split.slots[i] = static_cast<uint64_t>(std::floor(share[i])) / pg.slot_bytes;
      if (kind == TierKind::kGpu && split.slots[i] < pg.floor_slots) below_floor.push_back(i);
    }
    const bool changed = !below_floor.empty();
    for (size_t i : below_floor) {
      const PoolGroup& pg = s.pool_groups[i];
      if (config.pool_ratio) {
        split.notes.push_back("pool group " + std::to_string(i) + ": pool_ratio gives " +
                              std::to_string(split.slots[i]) + " slots, below its floor of " +
                              std::to_string(pg.floor_slots) + "; the floor wins");
      }
      split.slots[i] = pg.floor_slots;
      share[i] = static_cast<long double>(pg.floor_slots * pg.slot_bytes);
      pinned[i] = true;
      const uint64_t bytes = pg.floor_slots * pg.slot_bytes;
      available = bytes <= available ? available - bytes : 0;
    }
    if (!changed) break;
  }
  give_out_leftover(s, quota, fixed, share, split.slots);
  return split;
}

}  // namespace hybridkv::plan_detail

namespace hybridkv {

uint64_t tier_grain(TierKind kind, uint64_t quota_bytes) {
  switch (kind) {
    case TierKind::kGpu: {
      const uint64_t g = std::bit_floor(std::max<uint64_t>(quota_bytes / 512, 1));
      return std::clamp<uint64_t>(g, 2 * plan_detail::kMiB, 32 * plan_detail::kMiB);
    }
    case TierKind::kHost:
      return 4096;
    case TierKind::kDisk:
      return 2 * plan_detail::kMiB;
  }
  return 4096;
}

}  // namespace hybridkv
