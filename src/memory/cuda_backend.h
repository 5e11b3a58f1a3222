// The CUDA backend's class (internal to src/memory): cuda_backend.cc holds allocation, the copy
// engine (batches, waves, events) and pool growth; cuda_transfers.cc the DISK staging and the CPU
// side (byte transfers, fills, scans).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "hybridkv/units.h"
#include "memory/backends.h"
#include "memory/batch_runs.h"
#include "memory/convert.h"
#include "memory/cuda_kernels.h"
#include "memory/cuda_memory.h"
#include "memory/disk_store.h"
#include "util/check.h"

namespace hybridkv::memory::cuda_detail {

using cuda::CopyPiece;
using cuda::cuda_status;
using cuda::Reservation;

#define HKV_CUDA_OK(expr)                                                                      \
  do {                                                                                         \
    const cudaError_t hkv_e = (expr);                                                          \
    HKV_CHECK(hkv_e == cudaSuccess, "cuda backend: %s: %s", #expr, cudaGetErrorString(hkv_e)); \
  } while (0)

// Piece lists travel to the device through a few pinned staging rings, each reused once the
// batch that used it has completed.
struct PieceRing {
  CopyPiece* host = nullptr;
  CopyPiece* device = nullptr;
  uint32_t capacity = 0;
  cudaEvent_t done = nullptr;
  bool used = false;
};

// Pieces per launch at most: a long batch is cut so that the device works while the host builds.
constexpr size_t kLaunchPieces = 4096;

class CudaBackend final : public MemoryBackend {
 public:
  CudaBackend(int device, std::shared_ptr<Env> env) : device_(device), env_(std::move(env)) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  ~CudaBackend() override;

  Status allocate(const StoragePlan& plan) override;
  std::byte* pool_base(TierKind tier, PoolGroupId pg, uint32_t pool) const override {
    auto it = pools_.find(key(tier, pg, pool));
    return it == pools_.end() ? nullptr : it->second.memory->base();
  }
  CopyEvent submit(std::vector<SlotCopy> batch) override;
  void wait(CopyEvent event) override;
  void stream_wait(Stream stream, CopyEvent event) override;
  Status grow(TierKind tier, PoolGroupId pg, uint64_t slots) override;
  void shrink(TierKind tier, PoolGroupId pg, uint64_t slots, CopyEvent after) override;
  void read_bytes(void* dst, const std::byte* src, size_t n) const override;
  void read_many(std::span<const PoolTransfer> transfers) override;
  void write_many(std::span<const PoolTransfer> transfers) override;
  void transfer_many(std::span<const PoolTransfer> transfers, bool to_pool);
  void write_bytes(std::byte* dst, const void* src, size_t n) const override;
  void fill(std::span<const std::span<std::byte>> spans, uint8_t value, Stream stream) override;
  std::vector<uint64_t> scan_non_finite(std::span<const std::span<const std::byte>> spans,
                                        std::span<const DType> dtypes) const override;
  Status copy_status() const override { return disk_ ? disk_->status() : Status::ok(); }
  Result<std::unique_ptr<StepArea>> make_step_area(size_t bytes) override;
  HostBuffer host_buffer(size_t bytes) override;  // pinned, mapped: the copy kernel writes it

 private:
  struct PoolMemory {
    std::unique_ptr<Reservation> memory;
    uint64_t slot_bytes = 0;
  };
  // The last wave (one kernel launch) that read or wrote a slot.
  struct SlotMark {
    uint64_t read = 0;
    uint64_t written = 0;
  };
  SlotMark& mark(TierKind tier, PoolGroupId pg, uint32_t slot) {
    return marks_[static_cast<size_t>(tier)][pg.value][slot];  // after ensure_mark
  }
  // Grows the marks of (tier, pg) to cover `slot` (references from mark() then go stale).
  void ensure_mark(TierKind tier, PoolGroupId pg, uint32_t slot) {
    std::vector<SlotMark>& marks = marks_[static_cast<size_t>(tier)][pg.value];
    if (slot >= marks.size()) marks.resize(std::max<size_t>(slot + 1, 2 * marks.size()));
  }
  static uint64_t key(TierKind tier, PoolGroupId pg, uint32_t pool) {
    return (static_cast<uint64_t>(tier) << 48) | (static_cast<uint64_t>(pg.value) << 16) | pool;
  }
  Status check_device(const StoragePlan& plan);
  Status allocate_tier(const StoragePlan& plan, const TierPlan& tier);
  std::byte* slot_at(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t slot) const {
    const PoolMemory& m = pools_.at(key(tier, pg, pool));
    return m.memory->base() + uint64_t{slot} * m.slot_bytes;
  }
  void add_pieces(const SlotCopy& c);
  void split(const std::byte* src, std::byte* dst, uint64_t bytes, cuda::PieceKind kind,
             uint64_t piece);
  // Launches pieces_ (then clears it) on `stream`; `launch` gets their device copy.
  template <typename Launch>
  void launch_pieces(cudaStream_t stream, Launch&& launch);
  void run_disk(std::span<const SlotCopy> copies);
  // A GPU slot's pool staged in the bounce buffer on its way to or from the disk.
  struct Staged {
    std::byte* gpu;
    std::byte* bounce;
    uint64_t bytes;
  };
  void run_staged(std::vector<DiskOp>& ops, std::vector<Staged>& staged, bool to_disk);
  CopyEvent record_locked();
  void retire_locked();
  cudaEvent_t event_of_locked(CopyEvent event) const;

  int device_;
  std::unordered_map<uint64_t, PoolMemory> pools_;
  std::unordered_map<uint32_t, uint32_t> pools_per_group_;
  ConversionTable conversions_;
  std::unique_ptr<DiskStore> disk_;
  std::shared_ptr<Env> env_;      // the DISK tier's I/O
  std::byte* bounce_ = nullptr;   // pinned staging of GPU <-> DISK copies
  std::byte* staging_ = nullptr;  // pinned staging of read_many / write_many
  uint64_t staging_bytes_ = 0;
  std::byte* staging_for(uint64_t bytes);
  uint64_t bounce_bytes_ = 0;

  mutable std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  std::array<PieceRing, 4> rings_;
  uint32_t next_ring_ = 0;
  std::vector<CopyPiece> pieces_;
  std::array<std::vector<std::vector<SlotMark>>, 3> marks_;  // [tier][pool group][slot],
                                                             // grown as slots are copied
  uint64_t wave_ = 0;
  std::deque<std::pair<uint64_t, cudaEvent_t>> in_flight_;  // by ticket, oldest first
  std::vector<cudaEvent_t> spare_events_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
};

template <typename Launch>
void CudaBackend::launch_pieces(cudaStream_t stream, Launch&& launch) {
  if (pieces_.empty()) return;
  PieceRing& r = rings_[next_ring_];
  next_ring_ = (next_ring_ + 1) % rings_.size();
  if (r.used) HKV_CUDA_OK(cudaEventSynchronize(r.done));
  const uint32_t n = static_cast<uint32_t>(pieces_.size());
  if (n > r.capacity) {
    if (r.host) HKV_CUDA_OK(cudaFreeHost(r.host));
    if (r.device) HKV_CUDA_OK(cudaFree(r.device));
    r.capacity = std::max<uint32_t>(n, 4096);
    HKV_CUDA_OK(cudaHostAlloc(&r.host, r.capacity * sizeof(CopyPiece), cudaHostAllocPortable));
    HKV_CUDA_OK(cudaMalloc(&r.device, r.capacity * sizeof(CopyPiece)));
  }
  std::copy(pieces_.begin(), pieces_.end(), r.host);
  HKV_CUDA_OK(
      cudaMemcpyAsync(r.device, r.host, n * sizeof(CopyPiece), cudaMemcpyHostToDevice, stream));
  HKV_CUDA_OK(launch(r.device, n));
  HKV_CUDA_OK(cudaEventRecord(r.done, stream));
  r.used = true;
  pieces_.clear();
}

}  // namespace hybridkv::memory::cuda_detail
