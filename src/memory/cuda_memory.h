// Address ranges of the CUDA backend that are reserved once and backed as pools grow, so that a
// pool group grows or shrinks without moving any other pool or any live page (rebalancing on
// real memory).
//
// GPU tier: CUDA virtual memory management (cuMemAddressReserve, then cuMemCreate + cuMemMap of
// one physical chunk per grain as the committed prefix grows; cuMemUnmap + cuMemRelease as it
// shrinks). HOST tier: an anonymous mapping reserved PROT_NONE, whose chunks are made writable
// and pinned with cudaHostRegister (mapped, so kernels read and write it at the same address),
// and unpinned and returned to the kernel when the prefix shrinks.
//
// Thread-safety: none; the backend serializes calls.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hybridkv/plan.h"
#include "hybridkv/status.h"

namespace hybridkv::memory::cuda {

// A CUDA runtime error as a Status naming what was attempted.
Status cuda_status(cudaError_t error, const std::string& what);

class Reservation {
 public:
  // Reserves `bytes` of address space on `tier` (GPU or HOST) of `device`; commits in chunks
  // of `chunk` bytes (rounded up to the device's granularity).
  static Result<std::unique_ptr<Reservation>> make(TierKind tier, int device, uint64_t bytes,
                                                   uint64_t chunk);
  ~Reservation();
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  std::byte* base() const { return base_; }
  uint64_t reserved() const { return reserved_; }
  uint64_t committed() const { return chunks_ * chunk_; }
  // Backs at least the first `bytes` bytes. On failure nothing new stays committed.
  Status commit(uint64_t bytes);
  // Releases the chunks wholly above the first `bytes` bytes. Requires: nothing reads them.
  void decommit(uint64_t bytes);

 private:
  Reservation() = default;
  Status map_chunk(uint64_t index);
  void unmap_chunk(uint64_t index);

  TierKind tier_ = TierKind::kGpu;
  int device_ = 0;
  std::byte* base_ = nullptr;
  uint64_t reserved_ = 0;
  uint64_t chunk_ = 0;
  uint64_t chunks_ = 0;                                // committed chunks, a prefix
  std::vector<CUmemGenericAllocationHandle> handles_;  // GPU: one per committed chunk
};

}  // namespace hybridkv::memory::cuda
