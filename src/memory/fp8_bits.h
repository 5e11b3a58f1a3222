// fp32 <-> scaled fp8 e4m3 blocks, shared by the host conversions and the device kernels so that
// a snapshot holds the same bytes whichever backend took it.
//
// A snapshot buffer of n fp32 values is ceil(n / 128) blocks; a block is one int8 exponent e
// followed by up to 128 e4m3 codes of value / 2^e, where e is the smallest exponent that brings
// the block's largest finite magnitude to at most 448 (e4m3's largest). Codes round to nearest
// even; magnitudes past 448 (infinities) saturate; a NaN stays a NaN (0x7f). Within a block the
// relative error is at most 2^-4 for values at least 2^-6 of its largest; smaller ones lose
// precision (e4m3 subnormals) and those under 2^-10 of it become 0.
#pragma once

#include <cmath>
#include <cstdint>

#include "memory/bf16_bits.h"
#include "plan/fp8_layout.h"
#include "util/host_device.h"

namespace hybridkv::memory {

// The layout's sizes are the plan's (it sizes snapshot slots with them).
using plan_detail::fp8_snapshot_bytes;
using plan_detail::fp8_value_count;
using plan_detail::kFp8BlockBytes;
using plan_detail::kFp8BlockValues;

// The block exponent for the largest finite magnitude `amax` of a block.
HKV_HOST_DEVICE inline int8_t fp8_block_exponent(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 0;
  int exp = 0;
  const float m = std::frexp(amax, &exp);  // amax = m * 2^exp, m in [0.5, 1); 448 = 0.875 * 2^9
  int e = m <= 0.875f ? exp - 9 : exp - 8;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return static_cast<int8_t>(e);
}

// e4m3 (fn: no infinities, S.1111.111 is NaN) code of `value` (already divided by 2^e).
HKV_HOST_DEVICE inline uint8_t f32_to_e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  float a = std::fabs(value);
  if (a > 448.0f) a = 448.0f;
  if (a < 0.015625f) {  // below 2^-6: subnormal, units of 2^-9 (8 of them: the smallest normal)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::rint(a * 512.0f)));
  }
  int exp = 0;
  const float m = std::frexp(a, &exp);  // a = (2m) * 2^(exp - 1), 2m in [1, 2)
  int mantissa = static_cast<int>(std::rint((2.0f * m - 1.0f) * 8.0f));
  int field = exp + 6;  // exp - 1 + bias 7
  if (mantissa == 8) mantissa = 0, ++field;
  int code = (field << 3) | mantissa;
  if (code > 0x7e) code = 0x7e;
  return static_cast<uint8_t>(sign | code);
}

HKV_HOST_DEVICE inline float e4m3_to_f32(uint8_t code) {
  const int field = (code >> 3) & 15;
  const int mantissa = code & 7;
  float a;
  if (field == 15 && mantissa == 7) {
    a = NAN;
  } else if (field == 0) {
    a = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    a = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, field - 7);
  }
  return (code & 0x80) ? -a : a;
}

}  // namespace hybridkv::memory
