// The byte size of an fp8 snapshot (scaled e4m3 blocks of memory/fp8_bits.h): the plan sizes
// snapshot slots with it, the backends convert into it. A snapshot of n fp32 values is
// ceil(n / 128) blocks of one exponent byte and up to 128 codes.
#pragma once

#include <cstdint>

#include "util/host_device.h"

namespace hybridkv::plan_detail {

inline constexpr uint32_t kFp8BlockValues = 128;
inline constexpr uint32_t kFp8BlockBytes = kFp8BlockValues + 1;  // exponent, then codes

// Bytes of the fp8 form of `f32_bytes` bytes of fp32 values.
HKV_HOST_DEVICE inline uint64_t fp8_snapshot_bytes(uint64_t f32_bytes) {
  const uint64_t n = f32_bytes / 4;
  return n + (n + kFp8BlockValues - 1) / kFp8BlockValues;
}

// The number of fp32 values whose fp8 form takes `fp8_bytes` bytes.
HKV_HOST_DEVICE inline uint64_t fp8_value_count(uint64_t fp8_bytes) {
  const uint64_t blocks = (fp8_bytes + kFp8BlockBytes - 1) / kFp8BlockBytes;
  return fp8_bytes - blocks;
}

}  // namespace hybridkv::plan_detail
