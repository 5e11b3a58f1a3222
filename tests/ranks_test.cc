// Several tensor-parallel ranks in one manager (issue 34 item 3): each rank holds its own copy
// of every pool (on its own device with the CUDA backend), every copy runs on each rank, one set
// of tables serves all. The fake engine writes every rank's pages with different bytes and
// checks them all, so a copy that reaches one rank and not the other, or a page read from the
// wrong rank, fails. Runs on the host backend (CI) and, as ranks_test_cuda, on the GPUs: one rank
// per device where there are two, else both ranks on device 0.
#include <gtest/gtest.h>

#include <cstring>

#include "bundled_models.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/testing/memory_store.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::advance;
using testing::LifecycleModel;
using testing::make_request;
using testing::random_tokens;
using testing::Request;

constexpr CacheGroupId kSsm(0), kFull(2);

// The test backend with two ranks.
BackendOptions two_ranks() {
  BackendOptions o = testing::test_backend();
  const int devices = o.kind == BackendKind::kCuda ? std::max(cuda_device_count(), 1) : 1;
  o.devices = {0, 1 % devices};
  return o;
}

class Ranks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::test_backend().kind == BackendKind::kEngine) {
      GTEST_SKIP() << "the engine runs its copy lists on its ranks itself (refusal tested below)";
    }
    rng_.seed(4242);
  }
  std::unique_ptr<KvCacheManager> make(const LifecycleModel& model = {}) {
    return testing::make_manager(model, two_ranks());
  }
  // One byte of a slot's page on a rank, flipped through the backend's byte access.
  static void flip(KvCacheManager& m, PoolGroupId pg, uint32_t slot, uint32_t rank) {
    std::byte* at = m.slot_address(TierKind::kGpu, pg, 0, slot, rank);
    ASSERT_NE(at, nullptr);
    std::byte b{};
    testing::read_pool_bytes(m, std::vector<PoolTransfer>{{at, &b, 1}});
    b ^= std::byte{0x5a};
    testing::write_pool_bytes(m, std::vector<PoolTransfer>{{at, &b, 1}});
  }
  std::mt19937_64 rng_;
};

TEST_F(Ranks, EachRankHoldsItsOwnPools) {
  auto m = make();
  ASSERT_TRUE(m);
  ASSERT_EQ(m->ranks(), 2u);
  for (const PoolGroup& pg : m->plan().pool_groups()) {
    for (TierKind tier : {TierKind::kGpu, TierKind::kHost}) {
      const uint32_t slots = m->plan().slots(tier, pg.id);
      const uint64_t bytes = uint64_t{slots} * pg.pools[0].slot_bytes;
      std::byte* a = m->slot_address(tier, pg.id, 0, 0, 0);
      std::byte* b = m->slot_address(tier, pg.id, 0, 0, 1);
      ASSERT_NE(a, nullptr);
      ASSERT_NE(b, nullptr);
      EXPECT_TRUE(a + bytes <= b || b + bytes <= a) << "pool group " << pg.id.value;
    }
  }
  EXPECT_EQ(m->slot_address(TierKind::kGpu, PoolGroupId(0), 0, 0, 2), nullptr);
}

// Suspend offloads every rank's pages to its host memory, resume brings them back (into other
// slots), and prefix reuse hands a new request pages and a snapshot both ranks hold.
TEST_F(Ranks, SuspendResumeAndPrefixReuseKeepEveryRanksBytes) {
  auto m = make();
  ASSERT_TRUE(m);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = random_tokens(rng_, 700);
  Request a = make_request(*m, tokens, 592);  // 37 full blocks: a snapshot at a block's end
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 592));
  ASSERT_OK(testing::commit_computed(a));
  ASSERT_OK(a.cache->close());
  // A second request with the same prompt reuses A's committed prefix on both ranks.
  Request b = make_request(*m, tokens, 650);
  EXPECT_EQ(b.cache->history(), 592u);
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(engine.verify(*b.cache, b.fake));
  ASSERT_OK(advance(engine, b, 660));
  ASSERT_OK(b.cache->suspend());
  (void)m->take_iteration_stats();
  std::vector<Request> others;
  for (int i = 0; i < 5; ++i) {  // they take the GPU: B's pages go to the host tier
    others.push_back(make_request(*m, random_tokens(rng_, 700), 600));
    ASSERT_OK(others.back().cache->resume({}));
    ASSERT_OK(advance(engine, others.back(), 600));
    ASSERT_OK(others.back().cache->suspend());
  }
  EXPECT_GT(m->take_iteration_stats().pages_offloaded, 0u);
  ASSERT_OK(b.cache->resume({}));
  EXPECT_GT(m->take_iteration_stats().pages_onboarded, 0u);
  ASSERT_OK(engine.verify(*b.cache, b.fake));  // both ranks, every byte
  ASSERT_OK(advance(engine, b, 680));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// The checks see each rank: a byte changed in one rank's page fails verification naming it.
TEST_F(Ranks, AByteChangedOnOneRankIsFoundOnThatRank) {
  for (uint32_t rank = 0; rank < 2; ++rank) {
    auto m = make();
    ASSERT_TRUE(m);
    testing::FakeEngine engine(*m);
    Request r = make_request(*m, random_tokens(rng_, 100), 64);
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(advance(engine, r, 64));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    const int32_t slot = (*r.cache->block_table(kFull))[1];
    const PoolGroupId pg = m->plan().cache_group(kFull).pool_group;
    flip(*m, pg, static_cast<uint32_t>(slot), rank);
    const Status s = engine.verify(*r.cache, r.fake);
    ASSERT_FALSE(s.is_ok()) << "rank " << rank;
    EXPECT_NE(s.message().find("of rank " + std::to_string(rank)), std::string::npos)
        << s.to_string();
  }
}

// Snapshots (live state -> snapshot slot) and the DISK tier run per rank too.
TEST_F(Ranks, DiskTierAndSnapshotsCarryBothRanks) {
  testing::TempDir dir;
  LifecycleModel model;
  model.host_quota = 1ull << 20;
  model.disk_quota = 16ull << 20;
  model.disk_path = dir.path;
  auto m = make(model);
  ASSERT_TRUE(m);
  testing::FakeEngine engine(*m);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {  // more than GPU and host hold: some pages reach the disk
    reqs.push_back(make_request(*m, random_tokens(rng_, 700), 600));
    ASSERT_OK(reqs.back().cache->resume({}));
    ASSERT_OK(advance(engine, reqs.back(), 600));
    ASSERT_OK(testing::commit_computed(reqs.back()));
    ASSERT_OK(reqs.back().cache->suspend());
  }
  EXPECT_GT(m->storage_stats().tiers.back().pool_groups[2].total_slots -
                m->storage_stats().tiers.back().pool_groups[2].free_slots,
            0u);
  for (Request& r : reqs) {
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(r.cache->suspend());
  }
  ASSERT_OK(m->copy_status());
  EXPECT_EQ(*reqs[0].cache->state_index(kSsm), kBadPageIndex);
}

// Each rank's step buffers hold the same tables, in its own memory.
TEST_F(Ranks, StepBuffersPerRankHoldTheSameTables) {
  ServingConfig serving;
  serving.max_batch = 4;
  serving.tokens_per_block = 16;
  serving.max_seq_len = 1024;
  serving.tiers = {{TierKind::kGpu, 1ull << 30, ""}};
  auto created = HybridCacheManager::create(testing::bundled_model("nemotron_h_8b.json", 8),
                                            serving, two_ranks());
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  HybridCacheManager& h = **created;
  ASSERT_EQ(h.manager().ranks(), 2u);
  const uint64_t id = 7;
  ASSERT_OK(h.add_request(id, random_tokens(rng_, 200)));
  ASSERT_OK(h.resume(id));
  ASSERT_OK(h.resize(id, 200, 0));
  ASSERT_OK(h.resize(id, 200, 200));
  ASSERT_OK(h.decode_step(std::vector<uint64_t>{id}));
  Result<HybridCacheManager::Step> step = h.prepare_step(std::vector<uint64_t>{id}, 0);
  ASSERT_TRUE(step.is_ok()) << step.status().to_string();
  std::vector<std::vector<int32_t>> seen;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    Result<const HybridCacheManager::StepBuffers*> v = h.step_buffers(rank);
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    ASSERT_OK(h.fill_step(*step, {}, rank));
    std::vector<int32_t> ints(2 * (*v)->capacity + (*v)->capacity * (*v)->row_stride);
    h.manager().synchronize();
    testing::read_pool_bytes(h.manager(), ints.data(),
                             reinterpret_cast<const std::byte*>((*v)->state_indices),
                             ints.size() * sizeof(int32_t));
    EXPECT_EQ(ints[0], step->entries[0].state_index) << "rank " << rank;
    seen.push_back(ints);
  }
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_NE((*h.step_buffers(0))->state_indices, (*h.step_buffers(1))->state_indices);
  const Result<const HybridCacheManager::StepBuffers*> none = h.step_buffers(2);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("rank 2"), std::string::npos);
}

TEST(RanksRefused, WhereSeveralRanksCannotServe) {
  LifecycleModel model;
  for (BackendKind kind : {BackendKind::kNone, BackendKind::kEngine}) {
    BackendOptions o{kind};
    o.devices = {0, 1};
    auto m = KvCacheManager::create(testing::lifecycle_config(model), o);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("2 devices"), std::string::npos) << m.status().to_string();
  }
  ManagerConfig shared = testing::lifecycle_config(model);
  shared.shared.store = std::make_shared<testing::MemoryStore>();
  BackendOptions o{BackendKind::kHost};
  o.devices = {0, 0};
  auto m = KvCacheManager::create(shared, o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("shared.store"), std::string::npos) << m.status().to_string();
  if (cuda_device_count() > 0) {
    BackendOptions c{BackendKind::kCuda};
    c.devices = {0, 99};
    auto bad = KvCacheManager::create(testing::lifecycle_config(model), c);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("device 99 (devices[1])"), std::string::npos)
        << bad.status().to_string();
  }
}

}  // namespace
}  // namespace hybridkv
