// Statistics the manager reports: per iteration (since the last take) and per tier.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/ids.h"

namespace hybridkv {

// One cache group's share of an iteration. Bytes are whole slots (what a copy moves).
struct GroupIterationStats {
  uint64_t reused_blocks = 0;   // tree pages new caches took at create (SSM: snapshots)
  uint64_t new_blocks = 0;      // fresh pages
  uint64_t evicted_blocks = 0;  // DROPPABLE tree pages dropped on the last tier
  uint64_t onboarded_blocks = 0;
  uint64_t onboarded_bytes = 0;
  uint64_t offloaded_blocks = 0;
  uint64_t offloaded_bytes = 0;
  uint64_t device_copy_blocks = 0;  // GPU-to-GPU copies (snapshots, partial tails, private copies)
  uint64_t device_copy_bytes = 0;
};

// One tier's share of an iteration's tier moves: pages moved into it from a warmer tier
// (offloads; the cancelled ones never ran) and out of it to a warmer tier (onboards).
struct TierIterationStats {
  uint64_t offloaded_bytes = 0;
  uint64_t offload_cancelled_bytes = 0;
  uint64_t onboarded_bytes = 0;
  // Evictions into this tier that went back to the copy it had kept (no transfer).
  uint64_t returned_to_copy_bytes = 0;

  TierIterationStats& operator+=(const TierIterationStats& o) {
    offloaded_bytes += o.offloaded_bytes;
    offload_cancelled_bytes += o.offload_cancelled_bytes;
    onboarded_bytes += o.onboarded_bytes;
    returned_to_copy_bytes += o.returned_to_copy_bytes;
    return *this;
  }
};

struct IterationStats {
  uint64_t pages_allocated = 0;  // fresh pages given to caches
  uint64_t pages_onboarded = 0;  // moved to the GPU tier
  uint64_t bytes_onboarded = 0;
  uint64_t pages_offloaded = 0;  // moved to a colder tier
  uint64_t bytes_offloaded = 0;
  uint64_t device_copies = 0;  // GPU-to-GPU page copies (snapshots, partial tails)
  uint64_t pages_dropped = 0;  // DROPPABLE pages dropped on the last tier
  // Offloads counted above whose copy never ran: the page was dropped before the copy engine
  // reached it (host backend), so the bus carried nothing.
  uint64_t pages_offload_cancelled = 0;
  uint64_t bytes_offload_cancelled = 0;
  // Kept copies (ManagerConfig::keep_colder_copies): bytes a colder tier kept as copies when
  // their pages went up, and evictions that went back to such a copy instead of being copied
  // down (not counted in the offloads above: the bus carried nothing).
  uint64_t bytes_copies_kept = 0;
  uint64_t pages_returned_to_copy = 0;
  uint64_t bytes_returned_to_copy = 0;
  uint64_t suspends = 0;
  uint64_t resumes = 0;
  uint64_t refused_resumes = 0;
  std::vector<GroupIterationStats> groups;  // by cache group id
  std::vector<TierIterationStats> tiers;    // by tier index (the plan's tier order)
};

struct PoolGroupStorage {
  PoolGroupId pool_group;
  uint64_t total_slots = 0;
  uint64_t free_slots = 0;
  uint64_t evictable_slots = 0;  // HELD or DROPPABLE pages in the eviction queues
};

struct TierStorage {
  TierKind tier = TierKind::kGpu;
  std::vector<PoolGroupStorage> pool_groups;
};

struct StorageStats {
  std::vector<TierStorage> tiers;
  uint64_t live_caches = 0;  // ACTIVE + SUSPENDED
  uint64_t active_caches = 0;
};

}  // namespace hybridkv
