#include "memory/convert.h"

#include <bit>
#include <cstring>

#include "memory/bf16_bits.h"

namespace hybridkv::memory {

std::vector<ConvertSegment> snapshot_segments(const StoragePlan& plan, CacheGroupId group,
                                              bool to_snapshot) {
  std::vector<ConvertSegment> out;
  for (uint32_t b : plan.cache_group(group).buffers) {
    const PlannedBuffer& buffer = plan.buffers()[b];
    if (buffer.snapshot_size == 0) continue;
    const bool shrinks = buffer.snapshot_size != buffer.size;
    ConvertSegment s;
    if (to_snapshot) {
      s = {buffer.pool,
           buffer.offset,
           buffer.size,
           buffer.snapshot_pool,
           buffer.snapshot_offset,
           shrinks ? Conversion::kF32ToBF16 : Conversion::kCopy};
    } else {
      s = {buffer.snapshot_pool, buffer.snapshot_offset,
           buffer.snapshot_size, buffer.pool,
           buffer.offset,        shrinks ? Conversion::kBF16ToF32 : Conversion::kCopy};
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
  }
}

}  // namespace hybridkv::memory
