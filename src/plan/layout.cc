// Coalescing (DESIGN §3.2): equal-size buffers of a group form a pool; groups with identical
// slot-size lists share a pool group.
#include <algorithm>
#include <map>

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

}  // namespace

void build_layout(const ManagerConfig& config, Structure& s) {
  // Per group: its pools, ordered by slot bytes descending (ties: larger buffers first).
  std::vector<std::vector<Pool>> group_pools(s.groups.size());
  for (CacheGroup& group : s.groups) {
    std::map<uint64_t, uint32_t> count_by_size;
    for (uint32_t b : group.buffers) ++count_by_size[s.buffers[b].size];
    std::vector<Pool>& pools = group_pools[group.id.value];
    for (const auto& [size, count] : count_by_size) pools.push_back({size, count, size * count});
    std::sort(pools.begin(), pools.end(), [](const Pool& a, const Pool& b) {
      if (a.slot_bytes != b.slot_bytes) return a.slot_bytes > b.slot_bytes;
      return a.buffer_size > b.buffer_size;
    });
    group.slot_sizes.clear();
    for (const Pool& p : pools) group.slot_sizes.push_back(p.slot_bytes);

    // Offsets: each buffer takes the next free place of its pool, in the group's slot order.
    std::vector<uint64_t> next_offset(pools.size(), 0);
    for (uint32_t b : group.buffers) {
      PlannedBuffer& buffer = s.buffers[b];
      for (uint32_t p = 0; p < pools.size(); ++p) {
        if (pools[p].buffer_size != buffer.size) continue;
        buffer.pool = p;
        buffer.offset = next_offset[p];
        next_offset[p] += buffer.size;
        break;
      }
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
}

}  // namespace hybridkv::plan_detail
