// The CUDA backend's class (internal to src/memory): cuda_backend.cc holds allocation, the copy
// engine (batches, waves, events) and pool growth; cuda_transfers.cc the DISK staging and the CPU
// side (byte transfers, fills, scans). Several tensor-parallel ranks, one device each
// (BackendOptions::devices): each rank holds its own copy of every pool and runs every batch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <map>
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

// Makes a device current for a scope and restores the caller's on leaving: the engine's
// threads keep the device they chose.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    HKV_CUDA_OK(cudaGetDevice(&previous_));
    if (previous_ != device) HKV_CUDA_OK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

struct PoolMemory {
  std::unique_ptr<Reservation> memory;
  uint64_t slot_bytes = 0;
};

// One tensor-parallel rank: its device, its pools on every tier, and the stream its copies run
// on. Every batch becomes the same kernels on each rank's stream, launched one after another
// without waiting, so the devices copy at once.
struct DeviceRank {
  int device = 0;
  uint32_t index = 0;    // the rank
  bool touched = false;  // allocate_rank began: this rank holds device resources
  std::unordered_map<uint64_t, PoolMemory> pools;  // by pool_key(tier, pg, pool)
  std::unique_ptr<DiskStore> disk;
  std::byte* bounce = nullptr;  // pinned staging of GPU <-> DISK copies
  cudaStream_t stream = nullptr;
  std::array<PieceRing, 4> rings;
  uint32_t next_ring = 0;
  std::vector<CopyPiece> pieces;  // of the launch being built
  std::vector<cudaEvent_t> spare_events;

  std::byte* slot_at(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t slot) const {
    const PoolMemory& m = pools.at(pool_key(tier, pg, pool));
    return m.memory->base() + uint64_t{slot} * m.slot_bytes;
  }
  uint64_t slot_bytes(TierKind tier, PoolGroupId pg, uint32_t pool) const {
    return pools.at(pool_key(tier, pg, pool)).slot_bytes;
  }
  // Launches `pieces` (then clears them) on `on`; `launch` gets their device copy.
  template <typename Launch>
  void launch_pieces(cudaStream_t on, Launch&& launch);
  ~DeviceRank();
};

class CudaBackend final : public MemoryBackend {
 public:
  CudaBackend(std::vector<int> devices, std::shared_ptr<Env> env);
  BackendKind kind() const override { return BackendKind::kCuda; }
  ~CudaBackend() override;

  uint32_t ranks() const override { return static_cast<uint32_t>(ranks_.size()); }
  Status allocate(const StoragePlan& plan) override;
  std::byte* pool_base(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t rank) const override {
    if (rank >= ranks_.size()) return nullptr;
    auto it = ranks_[rank]->pools.find(pool_key(tier, pg, pool));
    return it == ranks_[rank]->pools.end() ? nullptr : it->second.memory->base();
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
  Status copy_status() const override;
  Result<std::unique_ptr<StepArea>> make_step_area(size_t bytes, uint32_t rank) override;
  HostBuffer host_buffer(size_t bytes) override;  // pinned, mapped: the copy kernel writes it

 private:
  // The last wave (one kernel launch per rank) that read or wrote a slot.
  struct SlotMark {
    uint64_t read = 0;
    uint64_t written = 0;
  };
  // One batch's completion: an event per rank.
  struct InFlight {
    uint64_t ticket = 0;
    std::vector<cudaEvent_t> events;
  };
  SlotMark& mark(TierKind tier, PoolGroupId pg, uint32_t slot) {
    return marks_[static_cast<size_t>(tier)][pg.value][slot];  // after ensure_mark
  }
  // Grows the marks of (tier, pg) to cover `slot` (references from mark() then go stale).
  void ensure_mark(TierKind tier, PoolGroupId pg, uint32_t slot) {
    std::vector<SlotMark>& marks = marks_[static_cast<size_t>(tier)][pg.value];
    if (slot >= marks.size()) marks.resize(std::max<size_t>(slot + 1, 2 * marks.size()));
  }
  Status check_devices(const StoragePlan& plan);
  Status allocate_rank(const StoragePlan& plan, DeviceRank& rank);
  Status allocate_tier(const StoragePlan& plan, const TierPlan& tier, DeviceRank& rank);
  void add_pieces(const SlotCopy& c, DeviceRank& rank);
  void launch_wave();  // each rank's pieces, on its stream
  static void split(std::vector<CopyPiece>& out, const std::byte* src, std::byte* dst,
                    uint64_t bytes, cuda::PieceKind kind, uint64_t piece);
  void run_disk(std::span<const SlotCopy> copies, DeviceRank& rank);
  // A GPU slot's pool staged in the bounce buffer on its way to or from the disk.
  struct Staged {
    std::byte* gpu;
    std::byte* bounce;
    uint64_t bytes;
  };
  void run_staged(DeviceRank& rank, std::vector<DiskOp>& ops, std::vector<Staged>& staged,
                  bool to_disk);
  // The rank whose pools hold `at` (any tier), or ranks() when none does.
  uint32_t owner(const std::byte* at) const;
  std::vector<uint64_t> scan_on(uint32_t rank, std::span<const std::span<const std::byte>> spans,
                                std::span<const DType> dtypes) const;
  CopyEvent record_locked();
  void retire_locked();
  const InFlight* in_flight_of_locked(CopyEvent event) const;

  std::vector<std::unique_ptr<DeviceRank>> ranks_;
  std::unordered_map<uint32_t, uint32_t> pools_per_group_;
  ConversionTable conversions_;
  std::shared_ptr<Env> env_;      // the DISK tier's I/O
  std::byte* staging_ = nullptr;  // pinned staging of read_many / write_many
  uint64_t staging_bytes_ = 0;
  std::byte* staging_for(uint64_t bytes);
  uint64_t bounce_bytes_ = 0;
  // Every reservation by base address: (end, rank), for owner().
  std::map<const std::byte*, std::pair<const std::byte*, uint32_t>> ranges_;

  mutable std::mutex mu_;
  std::array<std::vector<std::vector<SlotMark>>, 3> marks_;  // [tier][pool group][slot],
                                                             // grown as slots are copied
  uint64_t wave_ = 0;
  std::deque<InFlight> in_flight_;  // by ticket, oldest first
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
};

template <typename Launch>
void DeviceRank::launch_pieces(cudaStream_t on, Launch&& launch) {
  if (pieces.empty()) return;
  PieceRing& r = rings[next_ring];
  next_ring = (next_ring + 1) % rings.size();
  if (r.used) HKV_CUDA_OK(cudaEventSynchronize(r.done));
  const uint32_t n = static_cast<uint32_t>(pieces.size());
  if (n > r.capacity) {
    if (r.host) HKV_CUDA_OK(cudaFreeHost(r.host));
    if (r.device) HKV_CUDA_OK(cudaFree(r.device));
    r.capacity = std::max<uint32_t>(n, 4096);
    HKV_CUDA_OK(cudaHostAlloc(&r.host, r.capacity * sizeof(CopyPiece), cudaHostAllocPortable));
    HKV_CUDA_OK(cudaMalloc(&r.device, r.capacity * sizeof(CopyPiece)));
  }
  std::copy(pieces.begin(), pieces.end(), r.host);
  HKV_CUDA_OK(cudaMemcpyAsync(r.device, r.host, n * sizeof(CopyPiece), cudaMemcpyHostToDevice, on));
  HKV_CUDA_OK(launch(r.device, n));
  HKV_CUDA_OK(cudaEventRecord(r.done, on));
  r.used = true;
  pieces.clear();
}

}  // namespace hybridkv::memory::cuda_detail
