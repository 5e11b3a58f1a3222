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
    Result<std::unique_ptr<DiskStore>> disk = DiskStore::open(disk_directory(plan), plan, t, env_);
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
  conversions_ = conversion_table(plan);
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
    pieces_.push_back({src + at, dst + at * scale_num / scale_den, n, kind});
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

void CudaBackend::add_pieces(const SlotCopy& c) {
  if (c.cancelled) return;
  if (c.dst_host != nullptr) {  // the slot's pools, one after the other, into mapped memory
    std::byte* at = c.dst_host;
    for (uint32_t p = 0; p < pools_per_group_.at(c.pool_group.value); ++p) {
      const uint64_t n = pools_.at(key(c.src_tier, c.pool_group, p)).slot_bytes;
      split(slot_at(c.src_tier, c.pool_group, p, c.src_slot), at, n, cuda::kPieceCopy,
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
      split(slot_at(c.src_tier, c.pool_group, p, c.src_slot),
            slot_at(c.dst_tier, c.pool_group, p, c.dst_slot),
            pools_.at(key(c.src_tier, c.pool_group, p)).slot_bytes, cuda::kPieceCopy, piece);
    }
    return;
  }
  for (const ConvertSegment& seg :
       conversions_.at(conversion_key(c.pool_group, *c.dst_pool_group))) {
    const cuda::PieceKind kind = piece_kind(seg.conversion);
    split(slot_at(c.src_tier, c.pool_group, seg.src_pool, c.src_slot) + seg.src_offset,
          slot_at(c.dst_tier, *c.dst_pool_group, seg.dst_pool, c.dst_slot) + seg.dst_offset,
          seg.src_bytes, kind, cuda::kPieceBytes);
  }
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
          if (c.dst_host != nullptr) {  // writes no slot: waits only for one that wrote its source
            if (mark(c.src_tier, c.pool_group, c.src_slot).written == wave_) launch();
            mark(c.src_tier, c.pool_group, c.src_slot).read = wave_;
            add_pieces(c);
            if (pieces_.size() >= kLaunchPieces) launch();
            continue;
          }
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

}  // namespace cuda_detail

Result<std::unique_ptr<MemoryBackend>> make_cuda_backend(const BackendOptions& options) {
  return std::unique_ptr<MemoryBackend>(new cuda_detail::CudaBackend(options.device, options.env));
}

}  // namespace hybridkv::memory
