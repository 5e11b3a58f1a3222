// The CUDA backend's DISK staging and CPU side: GPU <-> DISK copies through the pinned bounce
// buffer, byte transfers through pinned staging (one kernel for many), fills and NaN/Inf scans.
#include "memory/cuda_backend.h"

namespace hybridkv::memory::cuda_detail {

void CudaBackend::run_disk(std::span<const SlotCopy> copies, DeviceRank& rank) {
  DeviceScope on(rank.device);
  // Disk copies read what earlier copies wrote: everything queued so far completes first.
  HKV_CUDA_OK(cudaStreamSynchronize(rank.stream));
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
      std::byte* mem = rank.slot_at(other, c.pool_group, p, other_slot);
      const uint32_t disk_slot = to_disk ? c.dst_slot : c.src_slot;
      if (other == TierKind::kHost) {
        ops.push_back({to_disk, c.pool_group, p, disk_slot, mem});
        continue;
      }
      const uint64_t n = rank.slot_bytes(other, c.pool_group, p);
      if (used + n > bounce_bytes_ || (!staged.empty() && to_disk != to_disk_run)) {
        run_staged(rank, ops, staged, to_disk_run);
        used = 0;
      }
      to_disk_run = to_disk;
      std::byte* bounce = rank.bounce + used;
      used += n;
      if (to_disk) {
        HKV_CUDA_OK(cudaMemcpyAsync(bounce, mem, n, cudaMemcpyDeviceToHost, rank.stream));
      }
      staged.push_back({mem, bounce, n});
      ops.push_back({to_disk, c.pool_group, p, disk_slot, bounce});
    }
  }
  run_staged(rank, ops, staged, to_disk_run);
}

void CudaBackend::run_staged(DeviceRank& rank, std::vector<DiskOp>& ops,
                             std::vector<Staged>& staged, bool to_disk) {
  if (ops.empty()) return;
  if (to_disk) HKV_CUDA_OK(cudaStreamSynchronize(rank.stream));  // GPU -> bounce complete
  rank.disk->run(ops);
  if (!to_disk) {
    for (const Staged& s : staged) {
      HKV_CUDA_OK(cudaMemcpyAsync(s.gpu, s.bounce, s.bytes, cudaMemcpyHostToDevice, rank.stream));
    }
    HKV_CUDA_OK(cudaStreamSynchronize(rank.stream));  // the bounce is reused next
  }
  ops.clear();
  staged.clear();
}

void CudaBackend::read_bytes(void* dst, const std::byte* src, size_t n) const {
  HKV_CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
}

// Transfers through pinned staging (mapped: the copy kernel reads and writes it directly).
std::byte* CudaBackend::staging_for(uint64_t bytes) {
  if (bytes > staging_bytes_) {
    if (staging_) HKV_CUDA_OK(cudaFreeHost(staging_));
    staging_bytes_ = std::max<uint64_t>(bytes, 16ull << 20);
    HKV_CUDA_OK(
        cudaHostAlloc(&staging_, staging_bytes_, cudaHostAllocMapped | cudaHostAllocPortable));
  }
  return staging_;
}

HostBuffer CudaBackend::host_buffer(size_t bytes) {
  void* p = nullptr;
  DeviceScope on(ranks_.front()->device);
  HKV_CUDA_OK(
      cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  return HostBuffer(static_cast<std::byte*>(p),
                    HostBufferFree{[](std::byte* q) { (void)cudaFreeHost(q); }});
}

void CudaBackend::read_many(std::span<const PoolTransfer> transfers) {
  transfer_many(transfers, false);
}

void CudaBackend::write_many(std::span<const PoolTransfer> transfers) {
  transfer_many(transfers, true);
}

// Host bytes pass through the pinned stage; one kernel per rank moves them all between stage
// and that rank's pools, the ranks at once.
void CudaBackend::transfer_many(std::span<const PoolTransfer> transfers, bool to_pool) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const PoolTransfer& t : transfers) total += t.bytes;
  std::byte* stage = staging_for(total);
  uint64_t at = 0;
  for (const PoolTransfer& t : transfers) {
    const uint32_t r = owner(t.pool);
    HKV_CHECK(r < ranks(), "cuda backend: a transfer at %p is in no pool", (const void*)t.pool);
    std::vector<CopyPiece>& out = ranks_[r]->pieces;
    if (to_pool) {
      std::memcpy(stage + at, t.host, t.bytes);
      split(out, stage + at, t.pool, t.bytes, cuda::kPieceCopy, cuda::kPieceBytes);
    } else {
      split(out, t.pool, stage + at, t.bytes, cuda::kPieceCopy, cuda::kPieceBytes);
    }
    at += t.bytes;
  }
  for (auto& rank : ranks_) {
    DeviceScope on(rank->device);
    rank->launch_pieces(rank->stream, [&](const CopyPiece* p, uint32_t n) {
      return cuda::launch_copy_pieces(p, n, rank->stream);
    });
  }
  for (auto& rank : ranks_) {  // and the stage is free for the next call
    DeviceScope on(rank->device);
    HKV_CUDA_OK(cudaStreamSynchronize(rank->stream));
  }
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
    const uint32_t r = owner(span.data());
    HKV_CHECK(r < ranks(), "cuda backend: a fill at %p is in no pool", (const void*)span.data());
    split(ranks_[r]->pieces, span.data(), span.data(), span.size(), cuda::kPieceCopy,
          cuda::kPieceBytes);
  }
  // On the engine's stream: the fill is ordered with the engine's own kernels. A rank on
  // another device fills on its copy stream between two waits: after what `stream` ran so far,
  // and before what it runs next.
  const cudaStream_t engine = reinterpret_cast<cudaStream_t>(stream.handle);
  int engine_device = 0;
  if (engine == nullptr) {
    HKV_CUDA_OK(cudaGetDevice(&engine_device));
  } else {
    HKV_CUDA_OK(cudaStreamGetDevice(engine, &engine_device));
  }
  for (auto& rank : ranks_) {
    if (rank->pieces.empty()) continue;
    DeviceScope on(rank->device);
    auto launch = [&](cudaStream_t s) {
      rank->launch_pieces(s, [&](const CopyPiece* p, uint32_t n) {
        return cuda::launch_fill_pieces(p, n, value, s);
      });
    };
    if (rank->device == engine_device) {
      launch(engine);
      continue;
    }
    cudaEvent_t before = nullptr, after = nullptr;
    HKV_CUDA_OK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
    HKV_CUDA_OK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    HKV_CUDA_OK(cudaEventRecord(before, engine));
    HKV_CUDA_OK(cudaStreamWaitEvent(rank->stream, before, 0));
    launch(rank->stream);
    HKV_CUDA_OK(cudaEventRecord(after, rank->stream));
    HKV_CUDA_OK(cudaStreamWaitEvent(engine, after, 0));
    HKV_CUDA_OK(cudaEventDestroy(before));  // destroyed once the waits complete
    HKV_CUDA_OK(cudaEventDestroy(after));
  }
}

std::vector<uint64_t> CudaBackend::scan_non_finite(
    std::span<const std::span<const std::byte>> spans, std::span<const DType> dtypes) const {
  std::vector<uint64_t> first(spans.size(), UINT64_MAX);
  // Each rank scans its own spans on its device.
  for (uint32_t r = 0; r < ranks(); ++r) {
    std::vector<std::span<const std::byte>> mine;
    std::vector<DType> types;
    std::vector<size_t> index;
    for (size_t i = 0; i < spans.size(); ++i) {
      if (owner(spans[i].data()) != r) continue;
      mine.push_back(spans[i]);
      types.push_back(dtypes[i]);
      index.push_back(i);
    }
    if (mine.empty()) continue;
    const std::vector<uint64_t> found = scan_on(r, mine, types);
    for (size_t k = 0; k < index.size(); ++k) first[index[k]] = found[k];
  }
  return first;
}

std::vector<uint64_t> CudaBackend::scan_on(uint32_t rank,
                                           std::span<const std::span<const std::byte>> spans,
                                           std::span<const DType> dtypes) const {
  DeviceScope on(ranks_[rank]->device);
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

}  // namespace hybridkv::memory::cuda_detail
