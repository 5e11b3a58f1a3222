// Device kernels of the CUDA backend, launched on a stream the caller names. Every pointer is
// one a kernel may dereference: device memory or mapped (registered) pinned host memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hybridkv::memory::cuda {

// How a piece's bytes reach its destination (memory::Conversion, as a plain integer for the
// device).
enum PieceKind : uint32_t {
  kPieceCopy = 0,
  kPieceF32ToBF16 = 1,
  kPieceBF16ToF32 = 2,
  kPieceF32ToFP8 = 3,  // whole fp8 blocks (memory/fp8_bits.h) but perhaps the last
  kPieceFP8ToF32 = 4,
};

// One block's share of a copy: at most kPieceBytes source bytes.
struct CopyPiece {
  const void* src;
  void* dst;
  uint32_t bytes;  // source bytes
  uint32_t kind;   // PieceKind
};
inline constexpr uint32_t kPieceBytes = 64 * 1024;         // over the bus (measured: 51 GB/s)
inline constexpr uint32_t kDevicePieceBytes = 256 * 1024;  // device to device

// Runs `count` pieces (in device-readable memory): one thread block per piece.
cudaError_t launch_copy_pieces(const CopyPiece* pieces, uint32_t count, cudaStream_t stream);

// Sets `bytes` bytes at each of `count` destinations (pieces with src unused) to `value`.
cudaError_t launch_fill_pieces(const CopyPiece* pieces, uint32_t count, uint8_t value,
                               cudaStream_t stream);

// For each piece (src = buffer start, bytes, kind = dtype code), writes to first_bad[i] the
// index of its first non-finite element, or UINT64_MAX. dtype codes: 0 f32, 1 f16, 2 bf16,
// 3 fp8 e4m3, 4 fp8 e5m2.
cudaError_t launch_scan_pieces(const CopyPiece* pieces, uint32_t count,
                               unsigned long long* first_bad, cudaStream_t stream);

}  // namespace hybridkv::memory::cuda
