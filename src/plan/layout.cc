// Coalescing (DESIGN §3.2): equal-size buffers of a group form a pool; groups with identical
// slot-size lists share a pool group.
#include <algorithm>
#include <map>

#include "plan/fp8_layout.h"
#include "plan/plan_internal.h"

namespace hybridkv::plan_detail {
namespace {

bool is_fixed_private(const ManagerConfig& config, const CacheGroup& group) {
  return config.max_live_kv_caches.has_value() && group.kind == GroupKind::kSsm &&
         group.policy == ReusePolicy::kPrivate;
}

// SWA scratch (seeds 002, 004): one layer's share of a block in each pool of a window group.
// A buffer's scratch page is its place among its layer's buffers of the pool; a block of one
// layer takes the most pages any layer has in the pool, and a slot holds num_buffers pages.
void plan_scratch(CacheGroup& group, const std::vector<Pool>& pools,
                  std::vector<PlannedBuffer>& buffers) {
  group.scratch.assign(pools.size(), ScratchPool{});
  std::map<std::pair<uint32_t, LayerId>, uint32_t> next_page;  // (pool, layer) -> count
  for (uint32_t b : group.buffers) {
    PlannedBuffer& buffer = buffers[b];
    buffer.scratch_page = next_page[{buffer.pool, buffer.layer}]++;
  }
  for (uint32_t p = 0; p < pools.size(); ++p) {
    group.scratch[p].pages_per_slot = pools[p].num_buffers;
    for (const auto& [key, count] : next_page) {
      if (key.first == p) {
        group.scratch[p].pages_per_block = std::max(group.scratch[p].pages_per_block, count);
      }
    }
  }
  for (uint32_t b : group.buffers) {
    buffers[b].scratch_pages_per_block = group.scratch[buffers[b].pool].pages_per_block;
  }
}

// Pools of equal-size buffers, slot bytes descending (ties: larger buffers first).
std::vector<Pool> pools_of(const std::vector<uint64_t>& sizes) {
  std::map<uint64_t, uint32_t> count_by_size;
  for (uint64_t size : sizes) ++count_by_size[size];
  std::vector<Pool> pools;
  for (const auto& [size, count] : count_by_size) pools.push_back({size, count, size * count});
  std::sort(pools.begin(), pools.end(), [](const Pool& a, const Pool& b) {
    if (a.slot_bytes != b.slot_bytes) return a.slot_bytes > b.slot_bytes;
    return a.buffer_size > b.buffer_size;
  });
  return pools;
}

// Each buffer takes the next free place of the pool of its size, in slot order.
void place(const std::vector<Pool>& pools, const std::vector<uint64_t>& sizes,
           std::vector<std::pair<uint32_t, uint64_t>>& where) {
  std::vector<uint64_t> next_offset(pools.size(), 0);
  where.clear();
  for (uint64_t size : sizes) {
    for (uint32_t p = 0; p < pools.size(); ++p) {
      if (pools[p].buffer_size != size) continue;
      where.push_back({p, next_offset[p]});
      next_offset[p] += size;
      break;
    }
  }
}

// Reduced-precision snapshots: a pool group holding only the snapshots of an SSM group, whose
// fp32 buffers shrink to `dtype`.
void add_snapshot_pool_group(DType dtype, CacheGroup& group, Structure& s) {
  std::vector<uint64_t> sizes;
  bool shrinks = false;
  for (uint32_t b : group.buffers) {
    PlannedBuffer& buffer = s.buffers[b];
    const bool f32 = buffer.dtype == DType::kF32;
    buffer.snapshot_dtype = f32 ? dtype : buffer.dtype;
    buffer.snapshot_size = !f32 ? buffer.size
                           : dtype == DType::kFP8E4M3
                               ? fp8_snapshot_bytes(buffer.size)
                               : buffer.size / dtype_size(DType::kF32) * dtype_size(dtype);
    shrinks = shrinks || f32;
    sizes.push_back(buffer.snapshot_size);
  }
  if (!shrinks) {
    for (uint32_t b : group.buffers) s.buffers[b].snapshot_size = 0;
    return;
  }
  PoolGroup pg;
  pg.id = PoolGroupId(static_cast<uint32_t>(s.pool_groups.size()));
  pg.pools = pools_of(sizes);
  for (const Pool& p : pg.pools) pg.slot_bytes += p.slot_bytes;
  pg.snapshots_of = group.id;
  std::vector<std::pair<uint32_t, uint64_t>> where;
  place(pg.pools, sizes, where);
  for (size_t i = 0; i < group.buffers.size(); ++i) {
    s.buffers[group.buffers[i]].snapshot_pool = where[i].first;
    s.buffers[group.buffers[i]].snapshot_offset = where[i].second;
  }
  group.snapshot_pool_group = pg.id;
  s.pool_groups.push_back(std::move(pg));
}

}  // namespace

void build_layout(const ManagerConfig& config, Structure& s) {
  // Per group: its pools, ordered by slot bytes descending (ties: larger buffers first).
  std::vector<std::vector<Pool>> group_pools(s.groups.size());
  for (CacheGroup& group : s.groups) {
    std::vector<uint64_t> sizes;
    for (uint32_t b : group.buffers) sizes.push_back(s.buffers[b].size);
    std::vector<Pool>& pools = group_pools[group.id.value];
    pools = pools_of(sizes);
    group.slot_sizes.clear();
    for (const Pool& p : pools) group.slot_sizes.push_back(p.slot_bytes);
    std::vector<std::pair<uint32_t, uint64_t>> where;
    place(pools, sizes, where);
    for (size_t i = 0; i < group.buffers.size(); ++i) {
      s.buffers[group.buffers[i]].pool = where[i].first;
      s.buffers[group.buffers[i]].offset = where[i].second;
    }
    if (group.window) plan_scratch(group, pools, s.buffers);
  }

  // Pool groups, numbered in the order of their first cache group.
  s.pool_groups.clear();
  for (CacheGroup& group : s.groups) {
    const bool fixed = is_fixed_private(config, group);
    PoolGroup* target = nullptr;
    if (!fixed) {
      for (PoolGroup& pg : s.pool_groups) {
        if (pg.fixed_private) continue;
        if (s.groups[pg.groups.front().value].slot_sizes == group.slot_sizes) {
          target = &pg;
          break;
        }
      }
    }
    if (target == nullptr) {
      PoolGroup pg;
      pg.id = PoolGroupId(static_cast<uint32_t>(s.pool_groups.size()));
      pg.pools = group_pools[group.id.value];
      for (const Pool& p : pg.pools) pg.slot_bytes += p.slot_bytes;
      pg.fixed_private = fixed;
      s.pool_groups.push_back(std::move(pg));
      target = &s.pool_groups.back();
    }
    target->groups.push_back(group.id);
    group.pool_group = target->id;
    for (uint32_t b : group.buffers) s.buffers[b].pool_group = target->id;
  }
  // Snapshot pool groups come last, so that every other pool group keeps its id.
  if (!config.snapshot_dtype || !config.enable_block_reuse) return;
  for (CacheGroup& group : s.groups) {
    if (group.kind == GroupKind::kSsm && group.policy != ReusePolicy::kPrivate)
      add_snapshot_pool_group(*config.snapshot_dtype, group, s);
  }
}

}  // namespace hybridkv::plan_detail
