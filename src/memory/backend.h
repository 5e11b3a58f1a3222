// MemoryBackend: the narrow interface between metadata and bytes.
//
// The storage layer asks a backend for pool memory once (allocate) and then only submits batches
// of slot copies. A slot copy moves one slot of a pool group: every pool of the group at that
// slot index, from (tier, slot) to (tier, slot). Copies run in submission order on one queue
// (the host backend's worker thread; the CUDA backend's copy stream), so a later copy that reads
// what an earlier one wrote needs no extra ordering. CPU code that touches a slot waits for the
// slot's last event first.
//
// Thread-safety: submit/wait may be called from any thread; allocate once, first.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "hybridkv/memory.h"
#include "hybridkv/plan.h"

namespace hybridkv::memory {

class StepArea;

struct SlotCopy {
  PoolGroupId pool_group;
  // Another pool group for the destination: a live state <-> reduced-precision snapshot copy,
  // converted buffer by buffer (PlannedBuffer::snapshot_*). Unset: the same pool group.
  std::optional<PoolGroupId> dst_pool_group;
  TierKind src_tier = TierKind::kGpu;
  uint32_t src_slot = 0;
  TierKind dst_tier = TierKind::kGpu;
  uint32_t dst_slot = 0;
  bool cancelled = false;  // skipped by the copy engine (see MemoryBackend::cancel)
  // Set: the copy reads the source slot (every pool, in order, contiguous) into this host
  // memory instead of a slot (dst_tier and dst_slot unused); it must come from host_buffer().
  std::byte* dst_host = nullptr;
};

// Host memory the copy engine can write (SlotCopy::dst_host), freed by its deleter.
struct HostBufferFree {
  void (*release)(std::byte*) = nullptr;
  void operator()(std::byte* p) const {
    if (p != nullptr) release(p);
  }
};
using HostBuffer = std::unique_ptr<std::byte, HostBufferFree>;

// A batch waiting in a backend's queue (host: for its copy thread; engine: for the engine).
struct QueuedBatch {
  uint64_t ticket = 0;
  std::vector<SlotCopy> copies;
};

// MemoryBackend::cancel for a queue of batches not started yet, in ticket order with no gaps
// (the caller holds the queue's lock).
template <typename Queue>
bool cancel_queued(Queue& queue, CopyEvent event, uint32_t index) {
  if (queue.empty() || event.ticket < queue.front().ticket) return false;  // started or done
  const uint64_t at = event.ticket - queue.front().ticket;
  if (at >= queue.size() || index >= queue[at].copies.size()) return false;
  SlotCopy& c = queue[at].copies[index];
  if (c.cancelled) return false;
  c.cancelled = true;
  return true;
}

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual BackendKind kind() const = 0;
  // Allocates every pool of every tier of the plan.
  virtual Status allocate(const StoragePlan& plan) = 0;
  // Tensor-parallel ranks whose pools this backend holds (BackendOptions::devices); every copy
  // runs on each of them.
  virtual uint32_t ranks() const { return 1; }
  // Base address of a pool of a rank on a tier; nullptr for the none backend or past ranks().
  virtual std::byte* pool_base(TierKind tier, PoolGroupId pool_group, uint32_t pool,
                               uint32_t rank) const = 0;
  // Queues a batch; returns its event (ticket 0 for an empty batch).
  virtual CopyEvent submit(std::vector<SlotCopy> batch) = 0;
  // Blocks until `event` is complete.
  virtual void wait(CopyEvent event) = 0;
  // Skips copy `index` of the batch `event` if it has not started (its result is dead: the page
  // was dropped first); true when skipped. The event still completes. The none backend's copies
  // are complete at submission, so it never skips.
  virtual bool cancel(CopyEvent event, uint32_t index) {
    (void)event;
    (void)index;
    return false;
  }
  // The first copy that failed (a DISK write or read), or ok.
  virtual Status copy_status() const { return Status::ok(); }
  // `bytes` for a step's index buffers at a fixed address (step_area.h): device memory on the
  // rank's device with the CUDA backend, host memory elsewhere.
  virtual Result<std::unique_ptr<StepArea>> make_step_area(size_t bytes, uint32_t rank);
  // `bytes` of host memory a SlotCopy::dst_host may point into: pinned and mapped on the CUDA
  // backend, plain memory elsewhere (64-byte aligned). Thread-safe.
  virtual HostBuffer host_buffer(size_t bytes);

  // --- pools that grow and shrink (runtime quotas, rebalancing) ---
  // Backs the first `slots` slots of every pool of (tier, pool group); on failure nothing new
  // stays backed. Backends that back the whole reservation from the start do nothing.
  virtual Status grow(TierKind tier, PoolGroupId pool_group, uint64_t slots) {
    (void)tier, (void)pool_group, (void)slots;
    return Status::ok();
  }
  // Gives back the memory above the first `slots` slots once `after` completed.
  virtual void shrink(TierKind tier, PoolGroupId pool_group, uint64_t slots, CopyEvent after) {
    (void)tier, (void)pool_group, (void)slots, (void)after;
  }

  // --- the engine's side ---
  // Makes `stream` wait for `event` on every rank (CUDA: without blocking the host); backends
  // without streams block until it completes.
  virtual void stream_wait(Stream stream, CopyEvent event) {
    (void)stream;
    wait(event);
  }
  // Byte access to pool memory from the CPU (tests, diagnostics): plain memcpy where pools are
  // host memory, a synchronous device copy where they are not.
  virtual void read_bytes(void* dst, const std::byte* src, size_t n) const;
  virtual void write_bytes(std::byte* dst, const void* src, size_t n) const;
  // Many at once (CUDA: one kernel through pinned staging, then one synchronization).
  virtual void read_many(std::span<const PoolTransfer> transfers);
  virtual void write_many(std::span<const PoolTransfer> transfers);
  // Sets every byte of each span to `value`, ordered after what `stream` already runs (spans of
  // any rank; `stream` then waits for them all).
  virtual void fill(std::span<const std::span<std::byte>> spans, uint8_t value, Stream stream);
  // The index of the first non-finite element of each span (dtype of each), or UINT64_MAX.
  virtual std::vector<uint64_t> scan_non_finite(std::span<const std::span<const std::byte>> spans,
                                                std::span<const DType> dtypes) const;
};

Result<std::unique_ptr<MemoryBackend>> make_backend(const BackendOptions& options);

// A pool's key in a backend's maps: (rank, tier, pool group, pool).
inline uint64_t pool_key(TierKind tier, PoolGroupId pool_group, uint32_t pool, uint32_t rank = 0) {
  return (uint64_t{rank} << 56) | (static_cast<uint64_t>(tier) << 48) |
         (uint64_t{pool_group.value} << 16) | pool;
}

}  // namespace hybridkv::memory
