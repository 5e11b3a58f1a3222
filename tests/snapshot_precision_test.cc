// Reduced-precision snapshots (issue 12 item 5): the plan's snapshot pool group, the bf16
// conversions, and a snapshot's round trip through the host backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "lifecycle_fixture.h"
#include "memory/convert.h"

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

TEST(SnapshotPrecision, OnlyBf16IsAccepted) {
  ManagerConfig c = testing::lifecycle_config(LifecycleModel{});
  c.snapshot_dtype = DType::kFP8E4M3;
  const Status s = validate_config(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("snapshot_dtype fp8_e4m3"), std::string::npos) << s.message();
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
