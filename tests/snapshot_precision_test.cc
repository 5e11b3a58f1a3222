// Reduced-precision snapshots (issue 12 item 5): the plan's snapshot pool group, the bf16
// and fp8 conversions, and a snapshot's round trip through the host backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lifecycle_fixture.h"
#include "memory/convert.h"
#include "memory/fp8_bits.h"

namespace hybridkv {
namespace {

using testing::LifecycleModel;

TEST(SnapshotPrecision, PlanGivesSnapshotsTheirOwnPoolGroupWithHalfSizeFp32Buffers) {
  LifecycleModel model;
  model.snapshot_dtype = DType::kBF16;
  auto m = testing::make_manager(model);
  const StoragePlan& plan = m->plan();
  const CacheGroup& ssm = plan.cache_group(CacheGroupId(0));
  ASSERT_TRUE(ssm.snapshot_pool_group.has_value());
  const PoolGroup& snap = plan.pool_group(*ssm.snapshot_pool_group);
  EXPECT_EQ(snap.snapshots_of, ssm.id);
  EXPECT_TRUE(snap.groups.empty());
  // ssm_state 16,384 B of fp32 -> 8,192 B of bf16; conv_state (bf16) stays 4,096 B.
  EXPECT_EQ(snap.slot_bytes, 8192u + 4096u);
  const PlannedBuffer& state = **plan.find_buffer(0, "ssm_state");
  EXPECT_EQ(state.snapshot_size, 8192u);
  EXPECT_EQ(state.snapshot_dtype, DType::kBF16);
  EXPECT_EQ((*plan.find_buffer(0, "conv_state"))->snapshot_size, 4096u);
  EXPECT_EQ((*plan.find_buffer(0, "replay_row"))->snapshot_size, 0u);  // PRIVATE: never a snapshot
  // Without the option the plan is unchanged.
  auto plain = testing::make_manager(LifecycleModel{});
  EXPECT_FALSE(plain->plan().cache_group(CacheGroupId(0)).snapshot_pool_group.has_value());
  EXPECT_EQ(plain->plan().pool_groups().size() + 1, plan.pool_groups().size());
}

TEST(SnapshotPrecision, Fp8SnapshotsTake129BytesPer128Values) {
  LifecycleModel model;
  model.snapshot_dtype = DType::kFP8E4M3;
  auto m = testing::make_manager(model);
  const PlannedBuffer& state = **m->plan().find_buffer(0, "ssm_state");
  // 4,096 fp32 values -> 32 blocks of one exponent byte and 128 codes.
  EXPECT_EQ(state.snapshot_size, 32u * 129u);
  EXPECT_EQ(state.snapshot_dtype, DType::kFP8E4M3);
  const CacheGroup& ssm = m->plan().cache_group(CacheGroupId(0));
  EXPECT_EQ(m->plan().pool_group(*ssm.snapshot_pool_group).slot_bytes, 32u * 129u + 4096u);
}

TEST(SnapshotPrecision, OnlyBf16AndFp8AreAccepted) {
  ManagerConfig c = testing::lifecycle_config(LifecycleModel{});
  c.snapshot_dtype = DType::kFP8E5M2;
  const Status s = validate_config(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("snapshot_dtype fp8_e5m2"), std::string::npos) << s.message();
}

TEST(SnapshotPrecision, E4m3RoundsToNearestEvenSaturatesAndKeepsNaN) {
  using memory::e4m3_to_f32;
  using memory::f32_to_e4m3;
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()))));
  // 1 + 1/16 is halfway between 1 and 1 + 1/8: ties go to even (1); 1 + 3/16 goes to 1 + 1/4.
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.0625f)), 1.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.1875f)), 1.25f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(std::ldexp(3.0f, -9))), std::ldexp(3.0f, -9));  // subnormal
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(std::ldexp(1.0f, -11))), 0.0f);
  // Every code but the NaNs decodes to a value that encodes back to it.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(SnapshotPrecision, Fp8BlocksScaleEachBlockToItsLargestValue) {
  // Two blocks and a partial third: values spanning 2^-3 .. 2^12 in the first, tiny ones in the
  // second, a NaN and an infinity in the third.
  std::vector<float> values(300);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = std::ldexp(1.0f + (i % 7) / 7.0f, static_cast<int>(i % 16) - 3) * (i % 2 ? -1 : 1);
  for (size_t i = 128; i < 256; ++i) values[i] *= 1e-20f;
  values[290] = std::numeric_limits<float>::quiet_NaN();
  values[291] = std::numeric_limits<float>::infinity();
  std::vector<std::byte> packed(memory::fp8_snapshot_bytes(values.size() * 4));
  ASSERT_EQ(packed.size(), 300u + 3u);
  memory::f32_to_fp8_blocks(reinterpret_cast<const std::byte*>(values.data()), values.size(),
                            packed.data());
  std::vector<float> back(values.size());
  memory::fp8_blocks_to_f32(packed.data(), values.size(),
                            reinterpret_cast<std::byte*>(back.data()));
  for (size_t i = 0; i < values.size(); ++i) {
    if (i == 290) {
      EXPECT_TRUE(std::isnan(back[i]));
      continue;
    }
    if (i == 291) {
      EXPECT_GT(back[i], 0.0f);  // saturated to the block's largest code
      EXPECT_TRUE(std::isfinite(back[i]));
      continue;
    }
    // Values at least 2^-6 of their block's largest keep 3 mantissa bits.
    float amax = 0;
    for (size_t j = i / 128 * 128; j < std::min<size_t>(i / 128 * 128 + 128, 290); ++j)
      amax = std::max(amax, std::fabs(values[j]));
    if (std::fabs(values[i]) >= amax / 64)
      EXPECT_LE(std::fabs(back[i] - values[i]), std::fabs(values[i]) / 16) << i;
    else
      EXPECT_LE(std::fabs(back[i] - values[i]), amax / 64 / 16) << i;
  }
  // Values with 3 mantissa bits within 8 binades come back bit for bit.
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = std::ldexp(1.0f + (i % 8) / 8.0f, -(int)(i % 8));
  memory::f32_to_fp8_blocks(reinterpret_cast<const std::byte*>(values.data()), values.size(),
                            packed.data());
  memory::fp8_blocks_to_f32(packed.data(), values.size(),
                            reinterpret_cast<std::byte*>(back.data()));
  EXPECT_EQ(back, values);
}

TEST(SnapshotPrecision, Bf16RoundsToNearestEvenAndKeepsSpecialValues) {
  using memory::bf16_to_f32;
  using memory::f32_to_bf16;
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits stays a NaN (not infinity).
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(SnapshotPrecision, ConvertRunsEverySegmentOfASlot) {
  // One fp32 buffer of 4 floats, one bf16 buffer of 2 elements copied as is.
  const std::vector<memory::ConvertSegment> down = {
      {0, 0, 16, 0, 0, memory::Conversion::kF32ToBF16},
      {0, 16, 4, 0, 8, memory::Conversion::kCopy}};
  const float values[4] = {1.0f, -2.5f, 3.140625f, 1e-3f};
  std::byte src[20], mid[12], back[20] = {};
  std::memcpy(src, values, 16);
  std::memcpy(src + 16, "\x01\x02\x03\x04", 4);
  for (const auto& s : down) memory::convert(s, mid, src);
  const std::vector<memory::ConvertSegment> up = {{0, 0, 8, 0, 0, memory::Conversion::kBF16ToF32},
                                                  {0, 8, 4, 0, 16, memory::Conversion::kCopy}};
  for (const auto& s : up) memory::convert(s, back, mid);
  float out[4];
  std::memcpy(out, back, 16);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], 3.140625f);             // exact in bf16
  EXPECT_NEAR(out[3], 1e-3f, 1e-3f / 128);  // 8 bits of mantissa
  EXPECT_EQ(std::memcmp(back + 16, src + 16, 4), 0);
}

}  // namespace
}  // namespace hybridkv
