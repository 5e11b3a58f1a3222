#include "memory/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "memory/bf16_bits.h"
#include "memory/fp8_bits.h"

namespace hybridkv::memory {

std::vector<ConvertSegment> snapshot_segments(const StoragePlan& plan, CacheGroupId group,
                                              bool to_snapshot) {
  std::vector<ConvertSegment> out;
  for (uint32_t b : plan.cache_group(group).buffers) {
    const PlannedBuffer& buffer = plan.buffers()[b];
    if (buffer.snapshot_size == 0) continue;
    const bool shrinks = buffer.snapshot_size != buffer.size;
    const bool fp8 = buffer.snapshot_dtype == DType::kFP8E4M3;
    Conversion down = Conversion::kCopy, up = Conversion::kCopy;
    if (shrinks) {
      down = fp8 ? Conversion::kF32ToFP8 : Conversion::kF32ToBF16;
      up = fp8 ? Conversion::kFP8ToF32 : Conversion::kBF16ToF32;
    }
    ConvertSegment s;
    if (to_snapshot) {
      s = {buffer.pool,          buffer.offset,          buffer.size,
           buffer.snapshot_pool, buffer.snapshot_offset, down};
    } else {
      s = {buffer.snapshot_pool, buffer.snapshot_offset, buffer.snapshot_size,
           buffer.pool,          buffer.offset,          up};
    }
    out.push_back(s);
  }
  return out;
}

ConversionTable conversion_table(const StoragePlan& plan) {
  ConversionTable table;
  for (const CacheGroup& g : plan.cache_groups()) {
    if (!g.snapshot_pool_group) continue;
    table[conversion_key(g.pool_group, *g.snapshot_pool_group)] =
        snapshot_segments(plan, g.id, true);
    table[conversion_key(*g.snapshot_pool_group, g.pool_group)] =
        snapshot_segments(plan, g.id, false);
  }
  return table;
}

uint16_t f32_to_bf16(float value) { return f32_bits_to_bf16(std::bit_cast<uint32_t>(value)); }

float bf16_to_f32(uint16_t value) { return std::bit_cast<float>(bf16_to_f32_bits(value)); }

namespace {

float load_f32(const std::byte* at) {
  float f;
  std::memcpy(&f, at, 4);
  return f;
}

}  // namespace

void f32_to_fp8_blocks(const std::byte* src, uint64_t count, std::byte* dst) {
  for (uint64_t first = 0; first < count; first += kFp8BlockValues) {
    const uint64_t n = std::min<uint64_t>(kFp8BlockValues, count - first);
    float amax = 0.0f;
    for (uint64_t i = 0; i < n; ++i) {
      const float a = std::fabs(load_f32(src + 4 * (first + i)));
      if (std::isfinite(a) && a > amax) amax = a;
    }
    const int8_t e = fp8_block_exponent(amax);
    std::byte* block = dst + first / kFp8BlockValues * kFp8BlockBytes;
    block[0] = static_cast<std::byte>(e);
    for (uint64_t i = 0; i < n; ++i)
      block[1 + i] =
          static_cast<std::byte>(f32_to_e4m3(std::ldexp(load_f32(src + 4 * (first + i)), -e)));
  }
}

void fp8_blocks_to_f32(const std::byte* src, uint64_t count, std::byte* dst) {
  for (uint64_t first = 0; first < count; first += kFp8BlockValues) {
    const uint64_t n = std::min<uint64_t>(kFp8BlockValues, count - first);
    const std::byte* block = src + first / kFp8BlockValues * kFp8BlockBytes;
    const int e = static_cast<int8_t>(block[0]);
    for (uint64_t i = 0; i < n; ++i) {
      const float f = std::ldexp(e4m3_to_f32(static_cast<uint8_t>(block[1 + i])), e);
      std::memcpy(dst + 4 * (first + i), &f, 4);
    }
  }
}

void convert(const ConvertSegment& s, std::byte* dst_slot, const std::byte* src_slot) {
  const std::byte* src = src_slot + s.src_offset;
  std::byte* dst = dst_slot + s.dst_offset;
  switch (s.conversion) {
    case Conversion::kCopy:
      std::memcpy(dst, src, s.src_bytes);
      return;
    case Conversion::kF32ToBF16:
      for (uint64_t i = 0; i < s.src_bytes / 4; ++i) {
        float f;
        std::memcpy(&f, src + 4 * i, 4);
        const uint16_t h = f32_to_bf16(f);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case Conversion::kBF16ToF32:
      for (uint64_t i = 0; i < s.src_bytes / 2; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        const float f = bf16_to_f32(h);
        std::memcpy(dst + 4 * i, &f, 4);
      }
      return;
    case Conversion::kF32ToFP8:
      f32_to_fp8_blocks(src, s.src_bytes / 4, dst);
      return;
    case Conversion::kFP8ToF32:
      fp8_blocks_to_f32(src, fp8_value_count(s.src_bytes), dst);
      return;
  }
}

}  // namespace hybridkv::memory
