// The CUDA backend: the GPU tier in device memory (virtual memory management: each pool keeps
// its address range while its backing grows and shrinks), HOST in pinned memory mapped into
// the device's address space, DISK in files. Copies between GPU and HOST (either way, within a
// tier, and live state <-> bf16 snapshot conversions) run as one gather/scatter kernel per
// batch on the backend's own stream: a batch records a CUDA event, the engine's stream waits on
// exactly that event (stream_wait), and the host never blocks on copies it does not read. DISK
// copies stage through pinned memory and run on the submitting thread, in batch order.
#include "memory/cuda_backend.h"

#include "memory/fp8_bits.h"

namespace hybridkv::memory {
namespace cuda_detail {

DeviceRank::~DeviceRank() {
  // A rank refused before allocating (a device that does not exist) touches no device: a failed
  // cudaSetDevice would leave an error for the next kernel launch to report.
  if (!touched) return;
  (void)cudaSetDevice(device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
  for (PieceRing& r : rings) {
    if (r.host) cudaFreeHost(r.host);
    if (r.device) cudaFree(r.device);
    if (r.done) cudaEventDestroy(r.done);
  }
  if (bounce) cudaFreeHost(bounce);
  pools.clear();
  if (stream != nullptr) cudaStreamDestroy(stream);
}

CudaBackend::CudaBackend(std::vector<int> devices, std::shared_ptr<Env> env)
    : env_(std::move(env)) {
  for (int d : devices) {
    ranks_.push_back(std::make_unique<DeviceRank>());
    ranks_.back()->device = d;
    ranks_.back()->index = static_cast<uint32_t>(ranks_.size() - 1);
  }
}

CudaBackend::~CudaBackend() {
  int previous = 0;
  const bool known = cudaGetDevice(&previous) == cudaSuccess;
  for (const auto& rank : ranks_) {
    if (rank->stream == nullptr) continue;
    (void)cudaSetDevice(rank->device);
    cudaStreamSynchronize(rank->stream);
  }
  for (InFlight& f : in_flight_) {
    for (cudaEvent_t e : f.events) cudaEventDestroy(e);
  }
  if (staging_) cudaFreeHost(staging_);
  ranks_.clear();
  if (known) (void)cudaSetDevice(previous);
}

Status CudaBackend::check_devices(const StoragePlan& plan) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return Status::invalid(std::string("cuda backend: no CUDA device (") +
                           (e == cudaSuccess ? "none found" : cudaGetErrorString(e)) + ")");
  }
  const int gpu = tier_position(plan, TierKind::kGpu);
  const uint64_t quota = gpu < 0 ? 0 : plan.tiers()[gpu].quota;
  std::map<int, uint64_t> wanted;  // GPU bytes per device (two ranks may share one)
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    const int device = ranks_[r]->device;
    const std::string rank = ranks_.size() > 1 ? " (devices[" + std::to_string(r) + "])" : "";
    if (device < 0 || device >= count) {
      return Status::invalid("cuda backend: device " + std::to_string(device) + rank +
                             " does not exist (" + std::to_string(count) + " found)");
    }
    int host_pointer = 0;
    cudaDeviceGetAttribute(&host_pointer, cudaDevAttrCanUseHostPointerForRegisteredMem, device);
    if (!host_pointer) {
      return Status::invalid("cuda backend: device " + std::to_string(device) + rank +
                             " cannot address registered host memory at its host address");
    }
    wanted[device] += quota;
  }
  for (const auto& [device, bytes] : wanted) {
    DeviceScope on(device);
    size_t free_bytes = 0, total_bytes = 0;
    if (Status s = cuda_status(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"); !s)
      return s;
    if (bytes > free_bytes) {
      return Status(StatusCode::kOutOfPages, "cuda backend: the GPU quota " + format_bytes(bytes) +
                                                 " on device " + std::to_string(device) +
                                                 " exceeds the device's free memory " +
                                                 format_bytes(free_bytes));
    }
  }
  return Status::ok();
}

Status CudaBackend::allocate_tier(const StoragePlan& plan, const TierPlan& tier, DeviceRank& rank) {
  const uint64_t chunk = tier_grain(TierKind::kGpu, tier.quota);
  for (const PoolGroup& pg : plan.pool_groups()) {
    pools_per_group_[pg.id.value] = static_cast<uint32_t>(pg.pools.size());
    for (uint32_t p = 0; p < pg.pools.size(); ++p) {
      const uint64_t slot_bytes = pg.pools[p].slot_bytes;
      Result<std::unique_ptr<Reservation>> r = Reservation::make(
          tier.kind, rank.device, tier.reserved_slots[pg.id.value] * slot_bytes, chunk);
      if (!r) return r.status();
      if (Status s = (*r)->commit(tier.slots[pg.id.value] * slot_bytes); !s) {
        return Status(s.code(), s.message() + " (pool group " + std::to_string(pg.id.value) +
                                    " of the " + tier_kind_name(tier.kind) +
                                    " tier; lower its quota)");
      }
      const std::byte* base = (*r)->base();
      ranges_[base] = {base + (*r)->reserved(), rank.index};
      rank.pools[pool_key(tier.kind, pg.id, p)] = {std::move(r).value(), slot_bytes};
    }
  }
  return Status::ok();
}

Status CudaBackend::allocate_rank(const StoragePlan& plan, DeviceRank& rank) {
  DeviceScope on(rank.device);
  rank.touched = true;
  for (uint32_t t = 0; t < plan.tiers().size(); ++t) {
    const TierPlan& tier = plan.tiers()[t];
    if (tier.kind != TierKind::kDisk) {
      if (Status s = allocate_tier(plan, tier, rank); !s) return s;
      continue;
    }
    Result<std::unique_ptr<DiskStore>> disk = DiskStore::open(disk_directory(plan), plan, t, env_);
    if (!disk) return disk.status();
    rank.disk = std::move(disk).value();
    if (Status s = cuda_status(cudaHostAlloc(&rank.bounce, bounce_bytes_, cudaHostAllocPortable),
                               "pinned staging for the DISK tier");
        !s)
      return s;
  }
  if (Status s = cuda_status(cudaStreamCreateWithFlags(&rank.stream, cudaStreamNonBlocking),
                             "creating the copy stream");
      !s)
    return s;
  for (PieceRing& r : rank.rings) {
    if (Status s = cuda_status(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming),
                               "creating an event");
        !s)
      return s;
  }
  return Status::ok();
}

Status CudaBackend::allocate(const StoragePlan& plan) {
  if (Status s = check_devices(plan); !s) return s;
  bounce_bytes_ = 64ull << 20;  // GPU <-> DISK staging, reused once its batch is on disk
  for (const PoolGroup& pg : plan.pool_groups())
    for (const Pool& pool : pg.pools) bounce_bytes_ = std::max(bounce_bytes_, pool.slot_bytes);
  for (auto& rank : ranks_) {
    if (Status s = allocate_rank(plan, *rank); !s) return s;
  }
  // Wave marks of the memory tiers (DISK copies run on their own, in order).
  for (const TierPlan& tier : plan.tiers()) {
    marks_[static_cast<size_t>(tier.kind)].resize(plan.pool_groups().size());
  }
  conversions_ = conversion_table(plan);
  return Status::ok();
}

void CudaBackend::split(std::vector<CopyPiece>& out, const std::byte* src, std::byte* dst,
                        uint64_t bytes, cuda::PieceKind kind, uint64_t piece) {
  // Destination bytes per source byte: scale_num / scale_den (fp8 pieces are whole blocks).
  uint64_t scale_num = 1, scale_den = 1;
  switch (kind) {
    case cuda::kPieceF32ToBF16:
      scale_den = 2;
      break;
    case cuda::kPieceBF16ToF32:
      scale_num = 2;
      break;
    case cuda::kPieceF32ToFP8:
      scale_num = kFp8BlockBytes, scale_den = 4 * kFp8BlockValues;
      break;
    case cuda::kPieceFP8ToF32:
      scale_num = 4 * kFp8BlockValues, scale_den = kFp8BlockBytes;
      piece = piece / scale_num * scale_den;  // the same fp32 bytes per piece
      break;
    default:
      break;
  }
  for (uint64_t at = 0; at < bytes; at += piece) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(piece, bytes - at));
    out.push_back({src + at, dst + at * scale_num / scale_den, n, kind});
  }
}

namespace {

cuda::PieceKind piece_kind(Conversion conversion) {
  switch (conversion) {
    case Conversion::kF32ToBF16:
      return cuda::kPieceF32ToBF16;
    case Conversion::kBF16ToF32:
      return cuda::kPieceBF16ToF32;
    case Conversion::kF32ToFP8:
      return cuda::kPieceF32ToFP8;
    case Conversion::kFP8ToF32:
      return cuda::kPieceFP8ToF32;
    case Conversion::kCopy:
      break;
  }
  return cuda::kPieceCopy;
}

}  // namespace

void CudaBackend::add_pieces(const SlotCopy& c, DeviceRank& rank) {
  if (c.cancelled) return;
  std::vector<CopyPiece>& out = rank.pieces;
  if (c.dst_host != nullptr) {    // the slot's pools, one after the other, into mapped memory
    if (rank.index != 0) return;  // one rank only: the shared tier is refused with several
    std::byte* at = c.dst_host;
    for (uint32_t p = 0; p < pools_per_group_.at(c.pool_group.value); ++p) {
      const uint64_t n = rank.slot_bytes(c.src_tier, c.pool_group, p);
      split(out, rank.slot_at(c.src_tier, c.pool_group, p, c.src_slot), at, n, cuda::kPieceCopy,
            cuda::kPieceBytes);
      at += n;
    }
    return;
  }
  if (!c.dst_pool_group) {
    const uint32_t pools = pools_per_group_.at(c.pool_group.value);
    // Within the device, bigger pieces: fewer to build and send for the same bytes.
    const uint64_t piece = c.src_tier == TierKind::kGpu && c.dst_tier == TierKind::kGpu
                               ? cuda::kDevicePieceBytes
                               : cuda::kPieceBytes;
    for (uint32_t p = 0; p < pools; ++p) {
      split(out, rank.slot_at(c.src_tier, c.pool_group, p, c.src_slot),
            rank.slot_at(c.dst_tier, c.pool_group, p, c.dst_slot),
            rank.slot_bytes(c.src_tier, c.pool_group, p), cuda::kPieceCopy, piece);
    }
    return;
  }
  for (const ConvertSegment& seg :
       conversions_.at(conversion_key(c.pool_group, *c.dst_pool_group))) {
    split(out, rank.slot_at(c.src_tier, c.pool_group, seg.src_pool, c.src_slot) + seg.src_offset,
          rank.slot_at(c.dst_tier, *c.dst_pool_group, seg.dst_pool, c.dst_slot) + seg.dst_offset,
          seg.src_bytes, piece_kind(seg.conversion), cuda::kPieceBytes);
  }
}

void CudaBackend::launch_wave() {
  for (auto& rank : ranks_) {
    DeviceScope on(rank->device);
    rank->launch_pieces(rank->stream, [&](const CopyPiece* p, uint32_t n) {
      return cuda::launch_copy_pieces(p, n, rank->stream);
    });
  }
  ++wave_;  // every mark of the last wave is stale now
}

CopyEvent CudaBackend::submit(std::vector<SlotCopy> batch) {
  if (batch.empty()) return {};
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CopyPiece>& built = ranks_.front()->pieces;
  for_each_run(
      batch,
      [&](size_t first, size_t last) {
        // One kernel per rank runs its copies at once; a copy that touches a slot an earlier
        // copy of the batch writes (or writes one it reads) waits for the next launch, so the
        // batch keeps submission order.
        ++wave_;
        for (size_t i = first; i < last; ++i) {
          const SlotCopy& c = batch[i];
          ensure_mark(c.src_tier, c.pool_group, c.src_slot);
          const bool to_slot = c.dst_host == nullptr;
          if (to_slot) ensure_mark(c.dst_tier, c.dst_pool_group.value_or(c.pool_group), c.dst_slot);
          SlotMark& src = mark(c.src_tier, c.pool_group, c.src_slot);
          bool conflict = src.written == wave_;
          if (to_slot) {  // a copy into host memory writes no slot
            const SlotMark& dst =
                mark(c.dst_tier, c.dst_pool_group.value_or(c.pool_group), c.dst_slot);
            conflict = conflict || dst.written == wave_ || dst.read == wave_;
          }
          if (conflict) launch_wave();
          mark(c.src_tier, c.pool_group, c.src_slot).read = wave_;
          if (to_slot)
            mark(c.dst_tier, c.dst_pool_group.value_or(c.pool_group), c.dst_slot).written = wave_;
          for (auto& rank : ranks_) add_pieces(c, *rank);
          // A long batch starts on the devices while the rest of its pieces are built.
          if (built.size() >= kLaunchPieces) launch_wave();
        }
        launch_wave();
      },
      [&](size_t first, size_t last) {
        for (auto& rank : ranks_)
          run_disk(std::span<const SlotCopy>(batch).subspan(first, last - first), *rank);
      });
  return record_locked();
}

CopyEvent CudaBackend::record_locked() {
  retire_locked();
  InFlight f{++submitted_, {}};
  for (auto& rank : ranks_) {
    DeviceScope on(rank->device);
    cudaEvent_t e = nullptr;
    if (rank->spare_events.empty()) {
      HKV_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = rank->spare_events.back();
      rank->spare_events.pop_back();
    }
    HKV_CUDA_OK(cudaEventRecord(e, rank->stream));
    f.events.push_back(e);
  }
  in_flight_.push_back(std::move(f));
  return {submitted_};
}

void CudaBackend::retire_locked() {
  while (!in_flight_.empty()) {
    const InFlight& f = in_flight_.front();
    for (cudaEvent_t e : f.events) {
      if (cudaEventQuery(e) != cudaSuccess) return;
    }
    completed_ = f.ticket;
    for (size_t r = 0; r < f.events.size(); ++r) ranks_[r]->spare_events.push_back(f.events[r]);
    in_flight_.pop_front();
  }
}

const CudaBackend::InFlight* CudaBackend::in_flight_of_locked(CopyEvent event) const {
  // Batches complete in ticket order: the first at or after the ticket covers it.
  for (const InFlight& f : in_flight_) {
    if (f.ticket >= event.ticket) return &f;
  }
  return in_flight_.empty() ? nullptr : &in_flight_.back();
}

void CudaBackend::wait(CopyEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (event.ticket <= completed_) return;
  if (const InFlight* f = in_flight_of_locked(event)) {
    for (cudaEvent_t e : f->events) HKV_CUDA_OK(cudaEventSynchronize(e));
  }
  retire_locked();
}

void CudaBackend::stream_wait(Stream stream, CopyEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (event.ticket <= completed_) return;
  // Every rank's copies: a stream may wait on another device's event.
  if (const InFlight* f = in_flight_of_locked(event)) {
    for (cudaEvent_t e : f->events) {
      HKV_CUDA_OK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream.handle), e, 0));
    }
  }
}

Status CudaBackend::grow(TierKind tier, PoolGroupId pg, uint64_t slots) {
  if (tier == TierKind::kDisk) return Status::ok();  // files are sized for the reservation
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t pools = pools_per_group_.at(pg.value);
  // Every rank's pools, or none: on failure what this call committed is given back.
  std::vector<std::pair<PoolMemory*, uint64_t>> done;  // (pool, committed before)
  for (auto& rank : ranks_) {
    DeviceScope on(rank->device);
    for (uint32_t p = 0; p < pools; ++p) {
      PoolMemory& m = rank->pools.at(pool_key(tier, pg, p));
      const uint64_t before = m.memory->committed();
      if (Status s = m.memory->commit(slots * m.slot_bytes); !s) {
        for (auto& [undo, was] : done) undo->memory->decommit(was);
        return s;
      }
      done.emplace_back(&m, before);
    }
  }
  return Status::ok();
}

void CudaBackend::shrink(TierKind tier, PoolGroupId pg, uint64_t slots, CopyEvent after) {
  if (tier == TierKind::kDisk) return;
  wait(after);  // the copies out of the retired slots have run
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t pools = pools_per_group_.at(pg.value);
  for (auto& rank : ranks_) {
    DeviceScope on(rank->device);
    HKV_CUDA_OK(cudaStreamSynchronize(rank->stream));
    for (uint32_t p = 0; p < pools; ++p) {
      PoolMemory& m = rank->pools.at(pool_key(tier, pg, p));
      m.memory->decommit(slots * m.slot_bytes);
    }
  }
}

Status CudaBackend::copy_status() const {
  for (const auto& rank : ranks_) {
    if (rank->disk) {
      if (Status s = rank->disk->status(); !s) return s;
    }
  }
  return Status::ok();
}

uint32_t CudaBackend::owner(const std::byte* at) const {
  auto it = ranges_.upper_bound(at);
  if (it == ranges_.begin()) return ranks();
  --it;
  return at < it->second.first ? it->second.second : ranks();
}

}  // namespace cuda_detail

Result<std::unique_ptr<MemoryBackend>> make_cuda_backend(const BackendOptions& options) {
  std::vector<int> devices = options.devices;
  if (devices.empty()) devices.push_back(options.device);
  return std::unique_ptr<MemoryBackend>(
      new cuda_detail::CudaBackend(std::move(devices), options.env));
}

}  // namespace hybridkv::memory

namespace hybridkv {
int cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}
}  // namespace hybridkv
