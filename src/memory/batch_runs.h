// How a batch of slot copies is cut into runs that a backend executes one after the other: the
// copies that touch the DISK tier go to the disk store in runs of copies that touch different
// slots (those run in parallel); everything else stays in submission order between them. Shared
// by the host and CUDA backends.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "memory/backend.h"
#include "memory/disk_store.h"

namespace hybridkv::memory {

inline bool touches_disk(const SlotCopy& c) {
  return c.src_tier == TierKind::kDisk || c.dst_tier == TierKind::kDisk;
}

// Calls on_memory(first, last) for each run of copies that do not touch the disk and
// on_disk(first, last) for each run of disk copies with no slot in common.
template <typename OnMemory, typename OnDisk>
void for_each_run(std::span<const SlotCopy> batch, OnMemory&& on_memory, OnDisk&& on_disk) {
  size_t begin = 0;
  while (begin < batch.size()) {
    const bool disk = touches_disk(batch[begin]);
    std::set<std::tuple<int, uint32_t, uint32_t>> slots;  // (tier, pool group, slot) of disk runs
    size_t end = begin;
    for (; end < batch.size() && touches_disk(batch[end]) == disk; ++end) {
      if (!disk) continue;
      const SlotCopy& c = batch[end];
      const auto src = std::make_tuple(int(c.src_tier), c.pool_group.value, c.src_slot);
      const auto dst = std::make_tuple(int(c.dst_tier), c.pool_group.value, c.dst_slot);
      if (slots.count(src) || slots.count(dst)) break;
      slots.insert(src);
      slots.insert(dst);
    }
    if (disk) {
      on_disk(begin, end);
    } else {
      on_memory(begin, end);
    }
    begin = end;
  }
}

// The memory side of a copy within the disk: none.
inline std::byte* no_memory(uint32_t) { return nullptr; }

// The disk side of a copy, one operation per pool; `memory_slot(pool)` is the CPU-addressable
// bytes of the other side (not called for a copy within the disk).
template <typename MemorySlot>
void append_disk_ops(const SlotCopy& c, uint32_t pools, MemorySlot&& memory_slot,
                     std::vector<DiskOp>& ops) {
  const bool to_disk = c.dst_tier == TierKind::kDisk;
  const bool within = to_disk && c.src_tier == TierKind::kDisk;
  for (uint32_t p = 0; p < pools; ++p) {
    if (within) {  // memory_slot is not called
      ops.push_back({true, c.pool_group, p, c.dst_slot, nullptr, c.src_slot});
    } else {
      ops.push_back({to_disk, c.pool_group, p, to_disk ? c.dst_slot : c.src_slot, memory_slot(p)});
    }
  }
}

}  // namespace hybridkv::memory
