// The copy, fill and scan kernels: one thread block per piece, 16-byte words where the piece is
// aligned for them, so that one launch moves any mix of page sizes at the bus's speed.
#include "memory/cuda_kernels.h"

#include "memory/bf16_bits.h"
#include "memory/fp8_bits.h"

namespace hybridkv::memory::cuda {
namespace {

constexpr int kThreads = 256;

__device__ bool aligned16(const void* a, const void* b, uint32_t n) {
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | n) & 15u) == 0;
}

__device__ void copy_bytes(const void* src, void* dst, uint32_t n) {
  if (aligned16(src, dst, n)) {
    // Four 16-byte words in flight per thread before any is stored.
    const uint4* s = static_cast<const uint4*>(src);
    uint4* d = static_cast<uint4*>(dst);
    const uint32_t words = n / 16, step = blockDim.x;
    uint32_t i = threadIdx.x;
    for (; i + 3 * step < words; i += 4 * step) {
      const uint4 a = s[i], b = s[i + step], c = s[i + 2 * step], e = s[i + 3 * step];
      d[i] = a;
      d[i + step] = b;
      d[i + 2 * step] = c;
      d[i + 3 * step] = e;
    }
    for (; i < words; i += step) d[i] = s[i];
    return;
  }
  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint8_t* d = static_cast<uint8_t*>(dst);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// One warp per block of 128 values: each lane takes 4, the block's largest magnitude is a warp
// reduction.
__device__ void f32_to_fp8(const CopyPiece& p) {
  const float* s = static_cast<const float*>(p.src);
  uint8_t* d = static_cast<uint8_t*>(p.dst);
  const uint32_t count = p.bytes / 4, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (uint32_t first = threadIdx.x / 32 * kFp8BlockValues; first < count;
       first += warps * kFp8BlockValues) {
    const uint32_t n = min(kFp8BlockValues, count - first);
    float v[4], amax = 0.0f;
    for (int k = 0; k < 4; ++k) {
      const uint32_t i = lane + 32 * k;
      v[k] = i < n ? s[first + i] : 0.0f;
      if (isfinite(v[k])) amax = fmaxf(amax, fabsf(v[k]));
    }
    for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const int8_t e = fp8_block_exponent(amax);
    uint8_t* block = d + first / kFp8BlockValues * kFp8BlockBytes;
    if (lane == 0) block[0] = static_cast<uint8_t>(e);
    for (int k = 0; k < 4; ++k) {
      const uint32_t i = lane + 32 * k;
      if (i < n) block[1 + i] = f32_to_e4m3(ldexpf(v[k], -e));
    }
  }
}

__device__ void fp8_to_f32(const CopyPiece& p) {
  const uint8_t* s = static_cast<const uint8_t*>(p.src);
  float* d = static_cast<float*>(p.dst);
  const uint32_t count = static_cast<uint32_t>(fp8_value_count(p.bytes));
  for (uint32_t i = threadIdx.x; i < count; i += blockDim.x) {
    const uint8_t* block = s + i / kFp8BlockValues * kFp8BlockBytes;
    const int e = static_cast<int8_t>(block[0]);
    d[i] = ldexpf(e4m3_to_f32(block[1 + i % kFp8BlockValues]), e);
  }
}

__global__ void copy_pieces(const CopyPiece* pieces) {
  const CopyPiece p = pieces[blockIdx.x];
  switch (p.kind) {
    case kPieceF32ToBF16: {
      const uint32_t* s = static_cast<const uint32_t*>(p.src);
      uint16_t* d = static_cast<uint16_t*>(p.dst);
      for (uint32_t i = threadIdx.x; i < p.bytes / 4; i += blockDim.x)
        d[i] = f32_bits_to_bf16(s[i]);
      return;
    }
    case kPieceBF16ToF32: {
      const uint16_t* s = static_cast<const uint16_t*>(p.src);
      uint32_t* d = static_cast<uint32_t*>(p.dst);
      for (uint32_t i = threadIdx.x; i < p.bytes / 2; i += blockDim.x)
        d[i] = bf16_to_f32_bits(s[i]);
      return;
    }
    case kPieceF32ToFP8:
      f32_to_fp8(p);
      return;
    case kPieceFP8ToF32:
      fp8_to_f32(p);
      return;
    default:
      copy_bytes(p.src, p.dst, p.bytes);
  }
}

__global__ void fill_pieces(const CopyPiece* pieces, uint8_t value) {
  const CopyPiece p = pieces[blockIdx.x];
  uint8_t* d = static_cast<uint8_t*>(p.dst);
  if (((reinterpret_cast<uintptr_t>(d) | p.bytes) & 15u) == 0) {
    const uint32_t v = value * 0x01010101u;
    const uint4 word = make_uint4(v, v, v, v);
    for (uint32_t i = threadIdx.x; i < p.bytes / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(d)[i] = word;
    return;
  }
  for (uint32_t i = threadIdx.x; i < p.bytes; i += blockDim.x) d[i] = value;
}

__device__ bool non_finite(const uint8_t* at, uint32_t dtype) {
  switch (dtype) {
    case 0:
      return (*reinterpret_cast<const uint32_t*>(at) & 0x7f800000u) == 0x7f800000u;
    case 1:
      return (*reinterpret_cast<const uint16_t*>(at) & 0x7c00u) == 0x7c00u;
    case 2:
      return (*reinterpret_cast<const uint16_t*>(at) & 0x7f80u) == 0x7f80u;
    case 3:
      return (*at & 0x7fu) == 0x7fu;  // e4m3fn has no Inf; S.1111.111 is NaN
    case 4:
      return (*at & 0x7cu) == 0x7cu;
    default:
      return false;
  }
}

__device__ uint32_t dtype_bytes(uint32_t dtype) { return dtype == 0 ? 4 : dtype <= 2 ? 2 : 1; }

__global__ void scan_pieces(const CopyPiece* pieces, unsigned long long* first_bad) {
  const CopyPiece p = pieces[blockIdx.x];
  const uint32_t size = dtype_bytes(p.kind);
  const uint8_t* s = static_cast<const uint8_t*>(p.src);
  for (uint32_t e = threadIdx.x; e < p.bytes / size; e += blockDim.x) {
    if (non_finite(s + e * size, p.kind)) atomicMin(&first_bad[blockIdx.x], e);
  }
}

}  // namespace

cudaError_t launch_copy_pieces(const CopyPiece* pieces, uint32_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  copy_pieces<<<count, kThreads, 0, stream>>>(pieces);
  return cudaGetLastError();
}

cudaError_t launch_fill_pieces(const CopyPiece* pieces, uint32_t count, uint8_t value,
                               cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  fill_pieces<<<count, kThreads, 0, stream>>>(pieces, value);
  return cudaGetLastError();
}

cudaError_t launch_scan_pieces(const CopyPiece* pieces, uint32_t count,
                               unsigned long long* first_bad, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  scan_pieces<<<count, kThreads, 0, stream>>>(pieces, first_bad);
  return cudaGetLastError();
}

}  // namespace hybridkv::memory::cuda
