// Reduced-precision snapshots (ManagerConfig::snapshot_dtype): the per-buffer segments of a
// copy between a live SSM state (fp32 buffers) and its snapshot (bf16, or scaled fp8 e4m3
// blocks: memory/fp8_bits.h), and the conversions.
// Shared by every backend that holds bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "hybridkv/plan.h"

namespace hybridkv::memory {

enum class Conversion : uint8_t { kCopy, kF32ToBF16, kBF16ToF32, kF32ToFP8, kFP8ToF32 };

// One buffer of a slot: bytes at (src_pool, src_offset) go to (dst_pool, dst_offset).
struct ConvertSegment {
  uint32_t src_pool = 0;
  uint64_t src_offset = 0;
  uint64_t src_bytes = 0;
  uint32_t dst_pool = 0;
  uint64_t dst_offset = 0;
  Conversion conversion = Conversion::kCopy;
};

// The segments of a copy from a live state of `group` into its snapshot pool group
// (to_snapshot) or back. Requires: the group has a snapshot pool group.
std::vector<ConvertSegment> snapshot_segments(const StoragePlan& plan, CacheGroupId group,
                                              bool to_snapshot);

// The segments of every converted copy of a plan, by conversion_key(source, destination pool
// group): each snapshot pool group and its live group, both ways.
using ConversionTable = std::unordered_map<uint64_t, std::vector<ConvertSegment>>;
ConversionTable conversion_table(const StoragePlan& plan);
inline uint64_t conversion_key(PoolGroupId src, PoolGroupId dst) {
  return (uint64_t{src.value} << 32) | dst.value;
}

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
uint16_t f32_to_bf16(float value);
float bf16_to_f32(uint16_t value);
// `count` fp32 values to their scaled fp8 blocks (fp8_snapshot_bytes(4 * count) bytes) and back.
void f32_to_fp8_blocks(const std::byte* src, uint64_t count, std::byte* dst);
void fp8_blocks_to_f32(const std::byte* src, uint64_t count, std::byte* dst);

// Runs one segment between two slots (pointers to the start of each pool's slot).
void convert(const ConvertSegment& segment, std::byte* dst_slot, const std::byte* src_slot);

}  // namespace hybridkv::memory
