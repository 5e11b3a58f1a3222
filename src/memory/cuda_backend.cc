// The CUDA backend: the GPU tier in device memory (virtual memory management: each pool keeps
// its address range while its backing grows and shrinks), HOST in pinned memory mapped into
// the device's address space, DISK in files. Copies between GPU and HOST (either way, within a
// tier, and live state <-> bf16 snapshot conversions) run as one gather/scatter kernel per
// batch on the backend's own stream: a batch records a CUDA event, the engine's stream waits on
// exactly that event (stream_wait), and the host never blocks on copies it does not read. DISK
// copies stage through pinned memory and run on the submitting thread, in batch order.
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

namespace hybridkv::memory {
namespace {

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
  explicit CudaBackend(int device) : device_(device) {}
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
  void set_disk_fault(bool on) override {
    if (disk_) disk_->set_fault(on);
  }

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
  std::unordered_map<uint64_t, std::vector<ConvertSegment>> conversions_;
  std::unique_ptr<DiskStore> disk_;
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

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& [ticket, e] : in_flight_) cudaEventDestroy(e);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  for (PieceRing& r : rings_) {
    if (r.host) cudaFreeHost(r.host);
    if (r.device) cudaFree(r.device);
    if (r.done) cudaEventDestroy(r.done);
  }
  if (bounce_) cudaFreeHost(bounce_);
  if (staging_) cudaFreeHost(staging_);
  pools_.clear();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Status CudaBackend::check_device(const StoragePlan& plan) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return Status::invalid(std::string("cuda backend: no CUDA device (") +
                           (e == cudaSuccess ? "none found" : cudaGetErrorString(e)) + ")");
  }
  if (device_ < 0 || device_ >= count) {
    return Status::invalid("cuda backend: device " + std::to_string(device_) + " does not exist (" +
                           std::to_string(count) + " found)");
  }
  if (Status s = cuda_status(cudaSetDevice(device_), "cudaSetDevice"); !s) return s;
  int host_pointer = 0;
  cudaDeviceGetAttribute(&host_pointer, cudaDevAttrCanUseHostPointerForRegisteredMem, device_);
  if (!host_pointer) {
    return Status::invalid("cuda backend: device " + std::to_string(device_) +
                           " cannot address registered host memory at its host address");
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (Status s = cuda_status(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"); !s)
    return s;
  const int gpu = tier_position(plan, TierKind::kGpu);
  const uint64_t quota = gpu < 0 ? 0 : plan.tiers()[gpu].quota;
  if (quota > free_bytes) {
    return Status(StatusCode::kOutOfPages, "cuda backend: the GPU quota " + format_bytes(quota) +
                                               " exceeds the device's free memory " +
                                               format_bytes(free_bytes));
  }
  return Status::ok();
}

Status CudaBackend::allocate_tier(const StoragePlan& plan, const TierPlan& tier) {
  const uint64_t chunk = tier_grain(TierKind::kGpu, tier.quota);
  // Wave marks of the memory tiers (DISK copies run on their own, in order).
  auto& marks = marks_[static_cast<size_t>(tier.kind)];
  marks.resize(plan.pool_groups().size());
  for (const PoolGroup& pg : plan.pool_groups()) {
    pools_per_group_[pg.id.value] = static_cast<uint32_t>(pg.pools.size());
    for (uint32_t p = 0; p < pg.pools.size(); ++p) {
      const uint64_t slot_bytes = pg.pools[p].slot_bytes;
      Result<std::unique_ptr<Reservation>> r = Reservation::make(
          tier.kind, device_, tier.reserved_slots[pg.id.value] * slot_bytes, chunk);
      if (!r) return r.status();
      if (Status s = (*r)->commit(tier.slots[pg.id.value] * slot_bytes); !s) {
        return Status(s.code(), s.message() + " (pool group " + std::to_string(pg.id.value) +
                                    " of the " + tier_kind_name(tier.kind) +
                                    " tier; lower its quota)");
      }
      pools_[key(tier.kind, pg.id, p)] = {std::move(r).value(), slot_bytes};
    }
  }
  return Status::ok();
}

Status CudaBackend::allocate(const StoragePlan& plan) {
  if (Status s = check_device(plan); !s) return s;
  for (uint32_t t = 0; t < plan.tiers().size(); ++t) {
    const TierPlan& tier = plan.tiers()[t];
    if (tier.kind != TierKind::kDisk) {
      if (Status s = allocate_tier(plan, tier); !s) return s;
      continue;
    }
    Result<std::unique_ptr<DiskStore>> disk = DiskStore::open(disk_directory(plan), plan, t);
    if (!disk) return disk.status();
    disk_ = std::move(disk).value();
    bounce_bytes_ = 64ull << 20;  // GPU <-> DISK staging, reused once its batch is on disk
    for (const PoolGroup& pg : plan.pool_groups())
      for (const Pool& pool : pg.pools) bounce_bytes_ = std::max(bounce_bytes_, pool.slot_bytes);
    if (Status s = cuda_status(cudaHostAlloc(&bounce_, bounce_bytes_, cudaHostAllocPortable),
                               "pinned staging for the DISK tier");
        !s)
      return s;
  }
  for (const CacheGroup& g : plan.cache_groups()) {
    if (!g.snapshot_pool_group) continue;
    conversions_[(uint64_t{g.pool_group.value} << 32) | g.snapshot_pool_group->value] =
        snapshot_segments(plan, g.id, true);
    conversions_[(uint64_t{g.snapshot_pool_group->value} << 32) | g.pool_group.value] =
        snapshot_segments(plan, g.id, false);
  }
  if (Status s = cuda_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                             "creating the copy stream");
      !s)
    return s;
  for (PieceRing& r : rings_) {
    if (Status s = cuda_status(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming),
                               "creating an event");
        !s)
      return s;
  }
  return Status::ok();
}

void CudaBackend::split(const std::byte* src, std::byte* dst, uint64_t bytes, cuda::PieceKind kind,
                        uint64_t piece) {
  const uint64_t scale_num = kind == cuda::kPieceBF16ToF32 ? 2 : 1;
  const uint64_t scale_den = kind == cuda::kPieceF32ToBF16 ? 2 : 1;
  for (uint64_t at = 0; at < bytes; at += piece) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(piece, bytes - at));
    pieces_.push_back({src + at, dst + at * scale_num / scale_den, n, kind});
  }
}

void CudaBackend::add_pieces(const SlotCopy& c) {
  if (c.cancelled) return;
  if (!c.dst_pool_group) {
    const uint32_t pools = pools_per_group_.at(c.pool_group.value);
    // Within the device, bigger pieces: fewer to build and send for the same bytes.
    const uint64_t piece = c.src_tier == TierKind::kGpu && c.dst_tier == TierKind::kGpu
                               ? cuda::kDevicePieceBytes
                               : cuda::kPieceBytes;
    for (uint32_t p = 0; p < pools; ++p) {
      split(slot_at(c.src_tier, c.pool_group, p, c.src_slot),
            slot_at(c.dst_tier, c.pool_group, p, c.dst_slot),
            pools_.at(key(c.src_tier, c.pool_group, p)).slot_bytes, cuda::kPieceCopy, piece);
    }
    return;
  }
  for (const ConvertSegment& seg :
       conversions_.at((uint64_t{c.pool_group.value} << 32) | c.dst_pool_group->value)) {
    const cuda::PieceKind kind = seg.conversion == Conversion::kF32ToBF16   ? cuda::kPieceF32ToBF16
                                 : seg.conversion == Conversion::kBF16ToF32 ? cuda::kPieceBF16ToF32
                                                                            : cuda::kPieceCopy;
    split(slot_at(c.src_tier, c.pool_group, seg.src_pool, c.src_slot) + seg.src_offset,
          slot_at(c.dst_tier, *c.dst_pool_group, seg.dst_pool, c.dst_slot) + seg.dst_offset,
          seg.src_bytes, kind, cuda::kPieceBytes);
  }
}

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

void CudaBackend::run_disk(std::span<const SlotCopy> copies) {
  // Disk copies read what earlier copies wrote: everything queued so far completes first.
  HKV_CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<DiskOp> ops;
  // GPU pools go through the pinned bounce buffer, as many slots at a time as it holds.
  std::vector<Staged> staged;
  uint64_t used = 0;
  bool to_disk_run = false;
  for (const SlotCopy& c : copies) {
    if (c.cancelled) continue;
    const bool to_disk = c.dst_tier == TierKind::kDisk;
    const TierKind other = to_disk ? c.src_tier : c.dst_tier;
    const uint32_t other_slot = to_disk ? c.src_slot : c.dst_slot;
    const uint32_t pools = pools_per_group_.at(c.pool_group.value);
    if (c.src_tier == c.dst_tier) {  // within the disk (a pool resized)
      append_disk_ops(c, pools, no_memory, ops);
      continue;
    }
    for (uint32_t p = 0; p < pools; ++p) {
      std::byte* mem = slot_at(other, c.pool_group, p, other_slot);
      const uint32_t disk_slot = to_disk ? c.dst_slot : c.src_slot;
      if (other == TierKind::kHost) {
        ops.push_back({to_disk, c.pool_group, p, disk_slot, mem});
        continue;
      }
      const uint64_t n = pools_.at(key(other, c.pool_group, p)).slot_bytes;
      if (used + n > bounce_bytes_ || (!staged.empty() && to_disk != to_disk_run)) {
        run_staged(ops, staged, to_disk_run);
        used = 0;
      }
      to_disk_run = to_disk;
      std::byte* bounce = bounce_ + used;
      used += n;
      if (to_disk) {
        HKV_CUDA_OK(cudaMemcpyAsync(bounce, mem, n, cudaMemcpyDeviceToHost, stream_));
      }
      staged.push_back({mem, bounce, n});
      ops.push_back({to_disk, c.pool_group, p, disk_slot, bounce});
    }
  }
  run_staged(ops, staged, to_disk_run);
}

void CudaBackend::run_staged(std::vector<DiskOp>& ops, std::vector<Staged>& staged, bool to_disk) {
  if (ops.empty()) return;
  if (to_disk) HKV_CUDA_OK(cudaStreamSynchronize(stream_));  // GPU -> bounce complete
  disk_->run(ops);
  if (!to_disk) {
    for (const Staged& s : staged) {
      HKV_CUDA_OK(cudaMemcpyAsync(s.gpu, s.bounce, s.bytes, cudaMemcpyHostToDevice, stream_));
    }
    HKV_CUDA_OK(cudaStreamSynchronize(stream_));  // the bounce is reused next
  }
  ops.clear();
  staged.clear();
}

CopyEvent CudaBackend::submit(std::vector<SlotCopy> batch) {
  if (batch.empty()) return {};
  std::lock_guard<std::mutex> lock(mu_);
  HKV_CUDA_OK(cudaSetDevice(device_));
  for_each_run(
      batch,
      [&](size_t first, size_t last) {
        // One kernel runs its copies at once; a copy that touches a slot an earlier copy of
        // the batch writes (or writes one it reads) waits for the next launch, so the batch
        // keeps submission order.
        auto launch = [&] {
          launch_pieces(stream_, [&](const CopyPiece* p, uint32_t n) {
            return cuda::launch_copy_pieces(p, n, stream_);
          });
          ++wave_;  // every mark of the last wave is stale now
        };
        ++wave_;
        for (size_t i = first; i < last; ++i) {
          const SlotCopy& c = batch[i];
          ensure_mark(c.src_tier, c.pool_group, c.src_slot);
          ensure_mark(c.dst_tier, c.dst_pool_group.value_or(c.pool_group), c.dst_slot);
          SlotMark& src = mark(c.src_tier, c.pool_group, c.src_slot);
          SlotMark& dst = mark(c.dst_tier, c.dst_pool_group.value_or(c.pool_group), c.dst_slot);
          if (src.written == wave_ || dst.written == wave_ || dst.read == wave_) launch();
          src.read = wave_;
          dst.written = wave_;
          add_pieces(c);
          // A long batch starts on the device while the rest of its pieces are built.
          if (pieces_.size() >= kLaunchPieces) launch();
        }
        launch();
      },
      [&](size_t first, size_t last) {
        run_disk(std::span<const SlotCopy>(batch).subspan(first, last - first));
      });
  return record_locked();
}

CopyEvent CudaBackend::record_locked() {
  retire_locked();
  cudaEvent_t e = nullptr;
  if (spare_events_.empty()) {
    HKV_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } else {
    e = spare_events_.back();
    spare_events_.pop_back();
  }
  HKV_CUDA_OK(cudaEventRecord(e, stream_));
  in_flight_.emplace_back(++submitted_, e);
  return {submitted_};
}

void CudaBackend::retire_locked() {
  while (!in_flight_.empty() && cudaEventQuery(in_flight_.front().second) == cudaSuccess) {
    completed_ = in_flight_.front().first;
    spare_events_.push_back(in_flight_.front().second);
    in_flight_.pop_front();
  }
}

cudaEvent_t CudaBackend::event_of_locked(CopyEvent event) const {
  // Events complete in ticket order: the first at or after the ticket covers it.
  for (const auto& [ticket, e] : in_flight_) {
    if (ticket >= event.ticket) return e;
  }
  return in_flight_.empty() ? nullptr : in_flight_.back().second;
}

void CudaBackend::wait(CopyEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (event.ticket <= completed_) return;
  if (cudaEvent_t e = event_of_locked(event)) HKV_CUDA_OK(cudaEventSynchronize(e));
  retire_locked();
}

void CudaBackend::stream_wait(Stream stream, CopyEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (event.ticket <= completed_) return;
  if (cudaEvent_t e = event_of_locked(event)) {
    HKV_CUDA_OK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream.handle), e, 0));
  }
}

Status CudaBackend::grow(TierKind tier, PoolGroupId pg, uint64_t slots) {
  if (tier == TierKind::kDisk) return Status::ok();  // files are sized for the reservation
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t pools = pools_per_group_.at(pg.value);
  for (uint32_t p = 0; p < pools; ++p) {
    PoolMemory& m = pools_.at(key(tier, pg, p));
    const uint64_t before = m.memory->committed();
    if (Status s = m.memory->commit(slots * m.slot_bytes); !s) {
      for (uint32_t q = 0; q <= p; ++q) {
        PoolMemory& undo = pools_.at(key(tier, pg, q));
        undo.memory->decommit(q == p ? before : std::min(before, undo.memory->committed()));
      }
      return s;
    }
  }
  return Status::ok();
}

void CudaBackend::shrink(TierKind tier, PoolGroupId pg, uint64_t slots, CopyEvent after) {
  if (tier == TierKind::kDisk) return;
  wait(after);  // the copies out of the retired slots have run
  std::lock_guard<std::mutex> lock(mu_);
  HKV_CUDA_OK(cudaStreamSynchronize(stream_));
  const uint32_t pools = pools_per_group_.at(pg.value);
  for (uint32_t p = 0; p < pools; ++p) {
    PoolMemory& m = pools_.at(key(tier, pg, p));
    m.memory->decommit(slots * m.slot_bytes);
  }
}

void CudaBackend::read_bytes(void* dst, const std::byte* src, size_t n) const {
  HKV_CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
}

// Transfers through pinned staging (mapped: the copy kernel reads and writes it directly).
std::byte* CudaBackend::staging_for(uint64_t bytes) {
  if (bytes > staging_bytes_) {
    if (staging_) HKV_CUDA_OK(cudaFreeHost(staging_));
    staging_bytes_ = std::max<uint64_t>(bytes, 16ull << 20);
    HKV_CUDA_OK(cudaHostAlloc(&staging_, staging_bytes_, cudaHostAllocMapped));
  }
  return staging_;
}

void CudaBackend::read_many(std::span<const PoolTransfer> transfers) {
  transfer_many(transfers, false);
}

void CudaBackend::write_many(std::span<const PoolTransfer> transfers) {
  transfer_many(transfers, true);
}

// Host bytes pass through the pinned stage; one kernel moves them all between stage and pools.
void CudaBackend::transfer_many(std::span<const PoolTransfer> transfers, bool to_pool) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const PoolTransfer& t : transfers) total += t.bytes;
  std::byte* stage = staging_for(total);
  uint64_t at = 0;
  for (const PoolTransfer& t : transfers) {
    if (to_pool) {
      std::memcpy(stage + at, t.host, t.bytes);
      split(stage + at, t.pool, t.bytes, cuda::kPieceCopy, cuda::kPieceBytes);
    } else {
      split(t.pool, stage + at, t.bytes, cuda::kPieceCopy, cuda::kPieceBytes);
    }
    at += t.bytes;
  }
  launch_pieces(stream_, [&](const CopyPiece* p, uint32_t n) {
    return cuda::launch_copy_pieces(p, n, stream_);
  });
  HKV_CUDA_OK(cudaStreamSynchronize(stream_));  // and the stage is free for the next call
  if (to_pool) return;
  at = 0;
  for (const PoolTransfer& t : transfers) {
    std::memcpy(t.host, stage + at, t.bytes);
    at += t.bytes;
  }
}

void CudaBackend::write_bytes(std::byte* dst, const void* src, size_t n) const {
  HKV_CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
}

void CudaBackend::fill(std::span<const std::span<std::byte>> spans, uint8_t value, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::span<std::byte> span : spans) {
    split(span.data(), span.data(), span.size(), cuda::kPieceCopy, cuda::kPieceBytes);
  }
  // On the engine's stream: the fill is ordered with the engine's own kernels.
  const cudaStream_t engine = reinterpret_cast<cudaStream_t>(stream.handle);
  launch_pieces(engine, [&](const CopyPiece* p, uint32_t n) {
    return cuda::launch_fill_pieces(p, n, value, engine);
  });
}

std::vector<uint64_t> CudaBackend::scan_non_finite(
    std::span<const std::span<const std::byte>> spans, std::span<const DType> dtypes) const {
  std::vector<uint64_t> first(spans.size(), UINT64_MAX);
  if (spans.empty()) return first;
  std::vector<CopyPiece> pieces;
  std::vector<std::pair<size_t, uint64_t>> origin;  // (span, first element of the piece)
  for (size_t i = 0; i < spans.size(); ++i) {
    const uint32_t size = dtype_size(dtypes[i]);
    const uint64_t step = cuda::kPieceBytes / size * size;
    for (uint64_t at = 0; at < spans[i].size(); at += step) {
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(step, spans[i].size() - at));
      pieces.push_back({spans[i].data() + at, nullptr, n, static_cast<uint32_t>(dtypes[i])});
      origin.emplace_back(i, at / size);
    }
  }
  CopyPiece* dev_pieces = nullptr;
  unsigned long long* dev_first = nullptr;
  const size_t n = pieces.size();
  HKV_CUDA_OK(cudaMalloc(&dev_pieces, n * sizeof(CopyPiece)));
  HKV_CUDA_OK(cudaMalloc(&dev_first, n * sizeof(unsigned long long)));
  HKV_CUDA_OK(cudaMemcpy(dev_pieces, pieces.data(), n * sizeof(CopyPiece), cudaMemcpyDefault));
  HKV_CUDA_OK(cudaMemset(dev_first, 0xff, n * sizeof(unsigned long long)));
  HKV_CUDA_OK(cuda::launch_scan_pieces(dev_pieces, static_cast<uint32_t>(n), dev_first, nullptr));
  std::vector<unsigned long long> found(n);
  HKV_CUDA_OK(
      cudaMemcpy(found.data(), dev_first, n * sizeof(unsigned long long), cudaMemcpyDefault));
  HKV_CUDA_OK(cudaFree(dev_pieces));
  HKV_CUDA_OK(cudaFree(dev_first));
  for (size_t p = 0; p < n; ++p) {
    if (found[p] == ~0ull) continue;
    const auto [span, base] = origin[p];
    first[span] = std::min<uint64_t>(first[span], base + found[p]);
  }
  return first;
}

}  // namespace

Result<std::unique_ptr<MemoryBackend>> make_cuda_backend(const BackendOptions& options) {
  return std::unique_ptr<MemoryBackend>(new CudaBackend(options.device));
}

}  // namespace hybridkv::memory
