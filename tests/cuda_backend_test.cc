// What only the CUDA backend does: device pools that grow and shrink on real memory, the
// engine's stream ordered after onboarding copies without the host waiting, and clear errors
// at creation. Runs with HYBRIDKV_TEST_BACKEND=cuda (label `gpu`); skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "hybridkv/manager.h"
#include "hybridkv/units.h"
#include "lifecycle_fixture.h"
#include "memory/convert.h"

namespace hybridkv {
namespace {

using testing::LifecycleModel;
using testing::Request;

uint64_t device_free_bytes() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

TEST(CudaBackend, GpuPoolsGrowAndShrinkOnDeviceMemoryWithPagesIntact) {
  LifecycleModel model;
  model.gpu_quota = 256ull << 20;
  model.gpu_max_quota = 1ull << 30;
  auto m = testing::make_manager(model, {BackendKind::kCuda});
  ASSERT_NE(m, nullptr);
  testing::FakeEngine engine(*m);
  std::mt19937_64 rng(3);
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(testing::make_request(*m, testing::random_tokens(rng, 700), 600));
    ASSERT_OK(requests.back().cache->resume({}));
    ASSERT_OK(testing::advance(engine, requests.back(), 600));
  }
  const uint64_t free_before = device_free_bytes();
  ASSERT_OK(m->set_quota(TierKind::kGpu, 1ull << 30));
  const uint64_t free_grown = device_free_bytes();
  // The growth is backed by device memory (the 768 MiB more, within the allocation grain).
  EXPECT_GE(free_before - free_grown, 700ull << 20);
  for (Request& r : requests) ASSERT_OK(engine.verify(*r.cache, r.fake));
  ASSERT_OK(m->set_quota(TierKind::kGpu, 192ull << 20));
  EXPECT_GE(device_free_bytes() - free_grown, 700ull << 20);  // and given back on shrinking
  for (Request& r : requests) {
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(testing::advance(engine, r, 700));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
  }
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST(CudaBackend, ResumeOrdersTheEnginesStreamAfterTheOnboardingCopies) {
  LifecycleModel model;  // 2 MiB GPU, 4 MiB host: suspended requests move to the host
  auto m = testing::make_manager(model, {BackendKind::kCuda});
  ASSERT_NE(m, nullptr);
  testing::FakeEngine engine(*m);
  std::mt19937_64 rng(4);
  std::vector<Request> requests;
  for (int i = 0; i < 12; ++i) {
    requests.push_back(testing::make_request(*m, testing::random_tokens(rng, 300), 300));
    ASSERT_OK(requests.back().cache->resume({}));
    ASSERT_OK(testing::advance(engine, requests.back(), 300));
    ASSERT_OK(requests.back().cache->suspend());
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const PlannedBuffer& key = **m->plan().find_buffer(1, "key");
  for (Request& r : requests) {
    // The engine reads the first page on its own stream right after resume(stream): it must
    // see the onboarded bytes although the host never waited.
    ASSERT_OK(r.cache->resume({reinterpret_cast<uintptr_t>(stream)}));
    const int32_t slot = (*r.cache->block_table(key.group))[0];
    std::vector<std::byte> seen(key.size), expected(key.size);
    const std::byte* page =
        m->slot_address(TierKind::kGpu, key.pool_group, key.pool, slot) + key.offset;
    ASSERT_EQ(cudaMemcpyAsync(seen.data(), page, key.size, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    testing::read_pool_bytes(*m, expected.data(), page,
                             key.size);  // after every copy, for comparison
    m->synchronize();
    testing::read_pool_bytes(*m, expected.data(), page, key.size);
    EXPECT_EQ(seen, expected);
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(r.cache->suspend());
  }
  cudaStreamDestroy(stream);
}

// A reduced-precision snapshot taken on the GPU holds the same bytes as the host conversion of
// the same state (memory::convert), for states no fake engine would write: random fp32 values
// over 40 binades, some NaN and infinite.
TEST(CudaBackend, ReducedPrecisionSnapshotsHoldTheHostConversionsBytes) {
  for (const DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    LifecycleModel model;
    model.snapshot_dtype = dtype;
    auto m = testing::make_manager(model, {BackendKind::kCuda});
    ASSERT_NE(m, nullptr);
    testing::FakeEngine engine(*m);
    std::mt19937_64 rng(5);
    Request r = testing::make_request(*m, testing::random_tokens(rng, 40), 40);
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(testing::advance(engine, r, 16));
    const PlannedBuffer& state = **m->plan().find_buffer(0, "ssm_state");
    std::vector<float> values(state.size / 4);
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    for (size_t i = 0; i < values.size(); ++i) {
      const float m = mantissa(rng);  // drawn before the exponent in every build
      values[i] = std::ldexp(m, static_cast<int>(rng() % 40) - 20);
    }
    values[7] = std::numeric_limits<float>::quiet_NaN();
    values[300] = -std::numeric_limits<float>::infinity();
    const CacheGroupId ssm(0);
    const int32_t slot = *r.cache->state_index(ssm);
    std::byte* live = m->slot_address(TierKind::kGpu, state.pool_group, state.pool, slot);
    ASSERT_EQ(cudaMemcpy(live + state.offset, values.data(), state.size, cudaMemcpyHostToDevice),
              cudaSuccess);
    // From pageable memory cudaMemcpy may return before its DMA lands; the snapshot's copy runs
    // on the backend's own stream (seen once on an H200: a snapshot of a half-written state).
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_OK(testing::commit_computed(r));
    std::optional<testing::TreePage> snap;
    for (const testing::TreePage& t : testing::tree_pages(*m)) {
      if (t.group == ssm) snap = t;
    }
    ASSERT_TRUE(snap && snap->tier == TierKind::kGpu);
    m->synchronize();
    std::vector<std::byte> got(state.snapshot_size);
    const std::byte* at =
        m->slot_address(TierKind::kGpu, snap->pool_group, state.snapshot_pool, snap->slot);
    ASSERT_EQ(
        cudaMemcpy(got.data(), at + state.snapshot_offset, got.size(), cudaMemcpyDeviceToHost),
        cudaSuccess);
    std::vector<std::byte> want(state.snapshot_size);
    const memory::ConvertSegment down{
        0,
        0,
        state.size,
        0,
        0,
        dtype == DType::kBF16 ? memory::Conversion::kF32ToBF16 : memory::Conversion::kF32ToFP8};
    memory::convert(down, want.data(), reinterpret_cast<const std::byte*>(values.data()));
    EXPECT_EQ(got, want);
  }
}

TEST(CudaBackend, ImpossibleQuotasAndDevicesAreRefusedAtCreation) {
  LifecycleModel model;
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  model.gpu_quota = total + (1ull << 30);
  Result<std::unique_ptr<KvCacheManager>> big =
      KvCacheManager::create(testing::lifecycle_config(model), {BackendKind::kCuda});
  ASSERT_FALSE(big.is_ok());
  EXPECT_NE(big.status().message().find("exceeds the device's free memory"), std::string::npos)
      << big.status().to_string();
  Result<std::unique_ptr<KvCacheManager>> nodev =
      KvCacheManager::create(testing::lifecycle_config(LifecycleModel{}), {BackendKind::kCuda, 99});
  ASSERT_FALSE(nodev.is_ok());
  EXPECT_NE(nodev.status().message().find("device 99"), std::string::npos);
}

}  // namespace
}  // namespace hybridkv
