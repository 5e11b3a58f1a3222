// A policy is one file, its registration and its test (issue 32 item 1): this file writes an
// eviction policy of its own ("newest first": the page queued last goes first), registers it,
// and runs it through storage alone and through a whole manager with the fake engine, touching
// nothing else. It also checks that an unknown policy name is refused naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <unordered_map>

#include "cache/rebalance_policy.h"
#include "hybridkv/testing/inspect.h"
#include "lifecycle_fixture.h"
#include "storage/eviction_policy.h"
#include "storage/offload_policy.h"
#include "storage/room.h"
#include "storage/storage.h"

namespace hybridkv {
namespace {

using storage::PageId;

// The page queued last goes first (MRU); demotion and prices are ignored.
class NewestFirstQueue final : public storage::EvictionQueue {
 public:
  void push_back(PageId id) override { at_[id.value] = order_.insert(order_.end(), id); }
  void remove(PageId id) override {
    order_.erase(at_.at(id.value));
    at_.erase(id.value);
  }
  PageId front() const override { return order_.empty() ? storage::kNoPage : order_.back(); }
  PageId front_not_demoted() const override { return front(); }
  uint64_t size() const override { return order_.size(); }
  std::vector<PageId> pages_in_order() const override { return {order_.rbegin(), order_.rend()}; }

 private:
  std::list<PageId> order_;
  std::unordered_map<uint32_t, std::list<PageId>::iterator> at_;
};

class NewestFirst final : public storage::EvictionPolicy {
 public:
  std::string name() const override { return "test-newest-first"; }
  bool uses_demotion() const override { return false; }
  bool uses_prices() const override { return false; }
  std::unique_ptr<storage::EvictionQueue> make_queue(storage::PageTable*, storage::QueueKind,
                                                     const uint64_t*) const override {
    return std::make_unique<NewestFirstQueue>();
  }
  bool evicted_before(const storage::Page& a, const storage::Page& b, uint64_t) const override {
    return a.lru_tick > b.lru_tick;
  }
};

const bool registered = [] {
  return storage::register_eviction_policy(std::make_unique<NewestFirst>()).is_ok();
}();

struct Dropped : storage::PageOwner {
  std::vector<storage::OwnerTag> owners;
  void page_dropping(PageId, storage::OwnerTag owner, CacheGroupId) override {
    owners.push_back(owner);
  }
  void pages_updated(std::span<const storage::PageNotice>) override {}
};

// Fills the GPU with tree pages (owner = order; `pages` of them), then makes room for 2.
std::vector<storage::OwnerTag> victims(const std::string& policy, storage::OwnerTag* pages) {
  ManagerConfig c;
  c.tokens_per_block = 16;
  c.policies.eviction = policy;
  AttentionLayerConfig a;
  a.id = 0;
  a.buffers = {{"key", 4096, {}, {}}, {"value", 4096, {}, {}}};
  c.attention_layers.push_back(a);
  c.tiers = {{TierKind::kGpu, 64ull << 10, ""}};
  const StoragePlan plan = *StoragePlan::build(c);
  auto backend = std::move(memory::make_backend({BackendKind::kNone})).value();
  EXPECT_TRUE(backend->allocate(plan).is_ok());
  storage::Storage s(plan, backend.get());
  Dropped dropped;
  const storage::TierIndex gpu(0);
  for (*pages = 0; s.counts(gpu, PoolGroupId(0)).free > 0; ++*pages)
    s.set_owner(s.allocate(CacheGroupId(0), gpu), *pages);
  storage::make_room(s, gpu, PoolGroupId(0), 2, dropped);
  EXPECT_EQ(s.check(), "");
  return dropped.owners;
}

TEST(EvictionPolicy, ARegisteredPolicyChoosesTheVictims) {
  ASSERT_TRUE(registered);
  storage::OwnerTag n = 0;
  EXPECT_EQ(victims("lru", &n), (std::vector<storage::OwnerTag>{0, 1}));
  EXPECT_EQ(victims("test-newest-first", &n), (std::vector<storage::OwnerTag>{n - 1, n - 2}));
  EXPECT_GT(n, 2u);
}

TEST(EvictionPolicy, AWholeManagerServesIntactPagesUnderIt) {
  ASSERT_TRUE(registered);
  testing::LifecycleModel model;
  model.gpu_quota = 1ull << 20;
  ManagerConfig c = testing::lifecycle_config(model);
  c.policies.eviction = "test-newest-first";
  auto m = std::move(KvCacheManager::create(c, testing::test_backend())).value();
  testing::FakeEngine engine(*m);
  std::mt19937_64 rng(5);
  std::vector<testing::Request> done;
  for (int i = 0; i < 12; ++i) {  // more than the GPU holds: the tree evicts by the policy
    testing::Request r = testing::make_request(*m, testing::random_tokens(rng, 300), 300);
    ASSERT_OK(testing::resume_compute_commit(engine, r, 300));
    ASSERT_OK(r.cache->suspend());
    done.push_back(std::move(r));
    ASSERT_EQ(testing::check_invariants(*m), "");
  }
  for (testing::Request& r : done) {
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(r.cache->close());
  }
  EXPECT_GT(m->take_iteration_stats().pages_offloaded, 0u);
}

TEST(EvictionPolicy, UnknownNamesAreRefusedNamingTheFieldAndTheKnownOnes) {
  ManagerConfig c = testing::lifecycle_config(testing::LifecycleModel{});
  c.policies.eviction = "fifo";
  Result<std::unique_ptr<KvCacheManager>> m = KvCacheManager::create(c, {BackendKind::kNone});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("policies.eviction: no policy 'fifo' (known: priced, "
                                      "snapshot-aware, lru"),
            std::string::npos)
      << m.status().to_string();
  c = testing::lifecycle_config(testing::LifecycleModel{});
  c.policies.offload = "some";
  EXPECT_NE(KvCacheManager::create(c, {BackendKind::kNone})
                .status()
                .message()
                .find("policies.offload: no policy 'some' (known: selective, all, room)"),
            std::string::npos);
  c = testing::lifecycle_config(testing::LifecycleModel{});
  c.policies.rebalance = "on";
  EXPECT_NE(KvCacheManager::create(c, {BackendKind::kNone})
                .status()
                .message()
                .find("policies.rebalance: no policy 'on' (known: pressure)"),
            std::string::npos);
}

}  // namespace
}  // namespace hybridkv
