// Step buffers at fixed addresses (issue 32 item 6): sized once for the largest step, a growing
// batch never moves them, each fill holds exactly its step (prepare_step's indices, every
// request's block tables, -1 past them), and a too-wide table or too many entries is refused
// naming the request with nothing written. The same test runs on the cuda backend (label gpu),
// where the buffers are device memory read back here.
#include <gtest/gtest.h>

#include <vector>

#include "bundled_models.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/testing/inspect.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

class StepBuffersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServingConfig s;
    s.max_batch = 6;
    s.dummy_slots = 1;
    s.tokens_per_block = 16;
    s.max_seq_len = 256;  // 16 blocks per table
    s.tiers = {{TierKind::kGpu, 4ull << 30, ""}};
    Result<std::unique_ptr<HybridCacheManager>> h = HybridCacheManager::create(
        testing::bundled_model("nemotron_h_8b.json", 8), s, testing::test_backend());
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    h_ = std::move(h).value();
  }

  void start(uint64_t id, uint64_t tokens) {
    ASSERT_OK(h_->add_request(id, testing::random_tokens(rng_, tokens)));
    ASSERT_OK(h_->resume(id));
    ASSERT_OK(h_->resize(id, tokens, 0));
    ASSERT_OK(h_->resize(id, tokens, tokens));
  }

  // The buffers as the kernels see them (a device copy on the cuda backend).
  std::vector<int32_t> read(const HybridCacheManager::StepBuffers& v) {
    const size_t ints = 2 * size_t{v.capacity} + v.capacity * v.row_stride;
    std::vector<int32_t> out(ints);
    h_->manager().synchronize();
    testing::read_pool_bytes(h_->manager(), out.data(),
                             reinterpret_cast<const std::byte*>(v.state_indices),
                             ints * sizeof(int32_t));
    return out;
  }

  // The buffers hold `step` and -1 everywhere else.
  void expect_holds(const HybridCacheManager::Step& step, const std::vector<uint64_t>& ids) {
    const HybridCacheManager::StepBuffers& v = **h_->step_buffers();
    const std::vector<int32_t> got = read(v);
    const int32_t* tables = got.data() + 2 * v.capacity;
    for (size_t e = 0; e < v.capacity; ++e) {
      const bool used = e < step.entries.size();
      EXPECT_EQ(got[e], used ? step.entries[e].state_index : -1) << "entry " << e;
      EXPECT_EQ(got[v.capacity + e], used ? step.entries[e].replay_index : -1) << "entry " << e;
      for (size_t k = 0; k < v.table_groups.size(); ++k) {
        std::vector<int32_t> want(v.max_blocks, -1);
        if (e < ids.size()) {
          const auto t = *h_->cache(ids[e])->block_table(v.table_groups[k]);
          std::copy(t.begin(), t.end(), want.begin());
        }
        const int32_t* row = tables + e * v.row_stride + k * v.max_blocks;
        if (e >= ids.size() && used) continue;  // a dummy's own table
        EXPECT_EQ(std::vector<int32_t>(row, row + v.max_blocks), want)
            << "entry " << e << " group " << v.table_groups[k].value;
      }
    }
  }

  std::mt19937_64 rng_{31};
  std::unique_ptr<HybridCacheManager> h_;
};

TEST_F(StepBuffersTest, AGrowingBatchKeepsTheAddressesAndEachFillHoldsItsStep) {
  Result<const HybridCacheManager::StepBuffers*> first = h_->step_buffers();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const HybridCacheManager::StepBuffers& v = **first;
  EXPECT_EQ(v.capacity, 7u);     // max_batch + dummy_slots
  EXPECT_EQ(v.max_blocks, 16u);  // 256 / 16
  EXPECT_EQ(v.on_device, h_->manager().backend_kind() == BackendKind::kCuda);
  ASSERT_FALSE(v.table_groups.empty());
  const int32_t* state_at = v.state_indices;
  const int32_t* tables_at = v.block_tables;

  // 2 requests, then 5 (wider tables), then 2 again and a dummy: the same addresses throughout.
  std::vector<uint64_t> ids = {1, 2};
  start(1, 40);
  start(2, 20);
  const std::pair<size_t, uint32_t> steps[] = {{2, 0}, {5, 0}, {2, 1}};
  for (const auto& [n, dummies] : steps) {
    while (ids.size() < n) {
      ids.push_back(ids.size() + 1);
      start(ids.back(), 16 * ids.size() + 100);
    }
    ids.resize(n);
    ASSERT_OK(h_->decode_step(ids));
    Result<HybridCacheManager::Step> step = h_->prepare_step(ids, dummies);
    ASSERT_TRUE(step.is_ok()) << step.status().to_string();
    ASSERT_OK(h_->fill_step(*step));
    const HybridCacheManager::StepBuffers& now = **h_->step_buffers();
    EXPECT_EQ(now.state_indices, state_at);
    EXPECT_EQ(now.block_tables, tables_at);
    expect_holds(*step, ids);
  }
}

TEST_F(StepBuffersTest, ATooWideTableOrTooManyEntriesIsRefusedAndWritesNothing) {
  start(1, 40);
  Result<HybridCacheManager::Step> step = h_->prepare_step(std::vector<uint64_t>{1}, 0);
  ASSERT_TRUE(step.is_ok());
  ASSERT_OK(h_->fill_step(*step));
  const std::vector<int32_t> before = read(**h_->step_buffers());
  // More entries than max_batch + dummy_slots.
  HybridCacheManager::Step big = *step;
  big.entries.resize(8, big.entries[0]);
  const Status too_many = h_->fill_step(big);
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("8 entries but the step buffers hold 7"), std::string::npos)
      << too_many.to_string();
  // A request past max_seq_len (the engine admitted more than it declared).
  start(2, 300);
  Result<HybridCacheManager::Step> wide = h_->prepare_step(std::vector<uint64_t>{1, 2}, 0);
  ASSERT_TRUE(wide.is_ok());
  const Status too_wide = h_->fill_step(*wide);
  EXPECT_NE(too_wide.message().find("request 2 has 19 blocks"), std::string::npos)
      << too_wide.to_string();
  EXPECT_EQ(read(**h_->step_buffers()), before);
}

}  // namespace
}  // namespace hybridkv
