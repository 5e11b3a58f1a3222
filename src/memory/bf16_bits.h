// fp32 <-> bf16 on bit patterns, shared by the host conversions and the device kernels so that a
// snapshot holds the same bytes whichever backend took it. Round to nearest even; a NaN stays a
// (quiet) NaN, infinities stay infinite.
#pragma once

#include <cstdint>

#include "util/host_device.h"

namespace hybridkv::memory {

HKV_HOST_DEVICE inline uint16_t f32_bits_to_bf16(uint32_t bits) {
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

HKV_HOST_DEVICE inline uint32_t bf16_to_f32_bits(uint16_t value) { return uint32_t{value} << 16; }

}  // namespace hybridkv::memory
