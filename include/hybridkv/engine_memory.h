// Memory the engine owns (BackendKind::kEngine): hybridkv makes every decision (pages,
// evictions, tier moves, snapshots, block tables, state indices) and never touches a byte; the
// engine holds the pools and runs the copies hybridkv asks for.
//
// The copies come as batches, each with the CopyEvent that pages read or written by it wait
// for, in the order hybridkv submitted them. A batch is a list of lists: the consecutive copies
// between one pair of tiers and pool groups, as slot pairs. The engine runs the lists of a
// batch in order (a later list may read a slot an earlier one wrote; within a list no copy
// reads a slot another copy of it writes), then reports the batch done
// (KvCacheManager::copies_done, or EngineCopyQueue::done). A copy moves one slot of a pool
// group: every pool of the group at that slot index. Where the pool groups differ, the copy
// converts a live recurrent state to its reduced-precision snapshot or back, buffer by buffer
// (PlannedBuffer::snapshot_*).
//
// Two ways to take them: KvCacheManager::take_copies() (or the copies of
// HybridCacheManager::Step) in a scheduler whose workers own the memory, another process
// included; or an EngineMemory handed to the manager at creation, which also lets the
// manager's own waits run the copies (a single-process engine, and the testing library's
// HostEngine).
//
// Thread-safety: the queue's calls may come from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/ids.h"
#include "hybridkv/memory.h"
#include "hybridkv/status.h"

namespace hybridkv {

class StoragePlan;

struct EngineCopyList {
  TierKind src_tier{};
  TierKind dst_tier{};
  PoolGroupId src_pool_group;
  PoolGroupId dst_pool_group;  // differs from src_pool_group: a converting copy
  uint64_t slot_bytes = 0;     // bytes one copy reads: every pool of the source slot
  std::vector<uint32_t> src_slots;
  std::vector<uint32_t> dst_slots;  // dst_slots[i] receives src_slots[i]
};

struct EngineCopyBatch {
  CopyEvent event;  // done once every list ran
  std::vector<EngineCopyList> lists;
};

// The manager's side of the copies, handed to an EngineMemory at creation.
class EngineCopyQueue {
 public:
  virtual ~EngineCopyQueue() = default;
  // The batches submitted since the last take, oldest first (copies cancelled before the
  // take are left out; a batch left with none is still handed on, to be reported done).
  virtual std::vector<EngineCopyBatch> take() = 0;
  // Every batch up to `event` ran: its pages may be read and its source slots reused. An event
  // never submitted is refused, naming it.
  virtual Status done(CopyEvent event) = 0;
};

// The engine's memory, as the manager sees it. Every method has a default but attach.
class EngineMemory {
 public:
  virtual ~EngineMemory() = default;
  // Once, when the manager is created: the plan whose pools the engine holds (slots per
  // tier: TierPlan::reserved_slots; the plan is valid during the call only) and the queue its
  // copies come from (valid while the manager lives). An error fails the manager's creation.
  virtual Status attach(const StoragePlan& plan, EngineCopyQueue& queue) = 0;
  // A pool's address where this process can reach it (KvCacheManager::slot_address), else
  // nullptr (memory in another process).
  virtual std::byte* pool_base(TierKind tier, PoolGroupId pool_group, uint32_t pool) const {
    (void)tier, (void)pool_group, (void)pool;
    return nullptr;
  }
  // A thread of this process waits for the copies up to `event` (KvCacheManager::wait, or the
  // manager itself). The default does nothing and the wait blocks until they are reported
  // done from another thread; an engine that runs copies on the waiting thread takes and runs
  // them here.
  virtual void on_wait(CopyEvent event) { (void)event; }
  // The first copy that failed, or ok (KvCacheManager::copy_status).
  virtual Status copy_status() const { return Status::ok(); }
};

}  // namespace hybridkv
