// The CPU defaults of MemoryBackend's byte access: pool memory the CPU can address (the host
// backend, and the HOST tier of every backend).
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "util/check.h"

#include "memory/backend.h"

namespace hybridkv::memory {
namespace {

bool non_finite(const std::byte* at, DType dtype) {
  switch (dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, at, 4);
      return !std::isfinite(v);
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, at, 2);
      const uint16_t exponent = dtype == DType::kF16 ? 0x7c00 : 0x7f80;
      return (v & exponent) == exponent;  // exponent all ones: Inf or NaN
    }
    case DType::kFP8E4M3:
      return (static_cast<uint8_t>(*at) & 0x7f) == 0x7f;  // e4m3fn has no Inf; S.1111.111 is NaN
    case DType::kFP8E5M2:
      return (static_cast<uint8_t>(*at) & 0x7c) == 0x7c;
    default:
      return false;
  }
}

}  // namespace

void MemoryBackend::read_bytes(void* dst, const std::byte* src, size_t n) const {
  std::memcpy(dst, src, n);
}

void MemoryBackend::write_bytes(std::byte* dst, const void* src, size_t n) const {
  std::memcpy(dst, src, n);
}

HostBuffer MemoryBackend::host_buffer(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
  HKV_CHECK(p != nullptr, "host_buffer: %zu bytes not available", bytes);
  return HostBuffer(p, HostBufferFree{[](std::byte* q) { std::free(q); }});
}

void MemoryBackend::read_many(std::span<const PoolTransfer> transfers) {
  for (const PoolTransfer& t : transfers) read_bytes(t.host, t.pool, t.bytes);
}

void MemoryBackend::write_many(std::span<const PoolTransfer> transfers) {
  for (const PoolTransfer& t : transfers) write_bytes(t.pool, t.host, t.bytes);
}

void MemoryBackend::fill(std::span<const std::span<std::byte>> spans, uint8_t value, Stream) {
  for (std::span<std::byte> s : spans) std::memset(s.data(), value, s.size());
}

std::vector<uint64_t> MemoryBackend::scan_non_finite(
    std::span<const std::span<const std::byte>> spans, std::span<const DType> dtypes) const {
  std::vector<uint64_t> first(spans.size(), UINT64_MAX);
  for (size_t i = 0; i < spans.size(); ++i) {
    const uint32_t size = dtype_size(dtypes[i]);
    for (uint64_t e = 0; (e + 1) * size <= spans[i].size(); ++e) {
      if (non_finite(spans[i].data() + e * size, dtypes[i])) {
        first[i] = e;
        break;
      }
    }
  }
  return first;
}

}  // namespace hybridkv::memory
