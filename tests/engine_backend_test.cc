// The engine backend (issue 34 item 1): memory the engine owns. hybridkv decides and hands out
// the copies as lists per pair of tiers and pool groups; the engine runs them and reports them
// done. The backend-independent suites run on it too (their `_engine` CTest twins, with the
// testing library's HostEngine); these tests check the lists themselves, the scheduler-only
// use (no EngineMemory: a vLLM-style scheduler whose workers hold the memory), the step's
// copies, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "bundled_models.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/testing/host_engine.h"
#include "hybridkv/testing/memory_store.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::Request;

BackendOptions host_engine(std::shared_ptr<testing::HostEngine>* out = nullptr) {
  auto engine = std::make_shared<testing::HostEngine>();
  if (out != nullptr) *out = engine;
  BackendOptions o{BackendKind::kEngine};
  o.engine = engine;
  return o;
}

// Every copy of the batches, as (src tier, dst tier, src slot, dst slot, src pool group).
struct Copy {
  TierKind src, dst;
  uint32_t src_slot, dst_slot;
  PoolGroupId pool_group;
};
std::vector<Copy> flatten(const std::vector<EngineCopyBatch>& batches) {
  std::vector<Copy> out;
  for (const EngineCopyBatch& b : batches) {
    for (const EngineCopyList& l : b.lists) {
      EXPECT_EQ(l.src_slots.size(), l.dst_slots.size());
      if (l.src_tier == l.dst_tier && l.src_pool_group == l.dst_pool_group) {
        // Within one memory no copy of a list reads a slot another copy of it writes.
        const std::set<uint32_t> read(l.src_slots.begin(), l.src_slots.end());
        for (uint32_t slot : l.dst_slots) EXPECT_EQ(read.count(slot), 0u) << "slot " << slot;
      }
      for (size_t i = 0; i < l.src_slots.size(); ++i)
        out.push_back({l.src_tier, l.dst_tier, l.src_slots[i], l.dst_slots[i], l.src_pool_group});
    }
  }
  return out;
}

// A suspended request pushed to the host by others, then resumed: the lists carry its
// offloads (GPU -> HOST) and its onboards (HOST -> GPU), and the onboards land exactly in the
// slots of its block table; the HostEngine, running only the lists, gives back every byte.
TEST(EngineBackend, ListsCarryTheTierMovesIntoTheSlotsOfTheTables) {
  std::mt19937_64 rng(3);
  std::shared_ptr<testing::HostEngine> host;
  auto m = testing::make_manager(testing::LifecycleModel{}, host_engine(&host));
  ASSERT_NE(m, nullptr);
  testing::FakeEngine engine(*m);
  Request a = testing::make_request(*m, testing::random_tokens(rng, 700), 600);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(testing::advance(engine, a, 600));
  ASSERT_OK(a.cache->suspend());
  std::vector<Request> others;
  for (int i = 0; i < 5; ++i) {
    others.push_back(testing::make_request(*m, testing::random_tokens(rng, 700), 600));
    ASSERT_OK(others.back().cache->resume({}));
    ASSERT_OK(testing::advance(engine, others.back(), 600));
    ASSERT_OK(others.back().cache->suspend());
  }
  (void)host->run();  // what is still queued (nobody waited for it yet)
  ASSERT_OK(a.cache->resume({}));
  const std::vector<EngineCopyBatch> batches = *m->take_copies();
  ASSERT_FALSE(batches.empty());
  const std::vector<Copy> copies = flatten(batches);
  // The GPU slots the resumed cache's tables and state indices name, by pool group.
  std::map<uint32_t, std::set<uint32_t>> named;
  for (const CacheGroup& g : m->plan().cache_groups()) {
    std::set<uint32_t>& slots = named[g.pool_group.value];
    if (g.kind == GroupKind::kSsm) {
      slots.insert(static_cast<uint32_t>(*a.cache->state_index(g.id)));
      continue;
    }
    const Result<std::span<const int32_t>> table = a.cache->block_table(g.id);
    ASSERT_TRUE(table.is_ok());
    for (int32_t slot : table.value()) {
      if (slot >= 0) slots.insert(static_cast<uint32_t>(slot));
    }
  }
  uint64_t onboards = 0;
  for (const Copy& c : copies) {
    if (c.src != TierKind::kHost || c.dst != TierKind::kGpu) continue;
    ++onboards;
    EXPECT_EQ(named[c.pool_group.value].count(c.dst_slot), 1u)
        << "an onboard into slot " << c.dst_slot << " of pool group " << c.pool_group.value
        << ", which the cache does not name";
  }
  EXPECT_GT(onboards, 0u);
  // The test took the lists: it runs them as an engine would (through the HostEngine's
  // memory), then reports them done; the fake engine finds every byte.
  for (const EngineCopyBatch& b : batches) {
    for (const EngineCopyList& l : b.lists) {
      const PoolGroup& spg = m->plan().pool_group(l.src_pool_group);
      for (size_t i = 0; i < l.src_slots.size(); ++i) {
        for (uint32_t p = 0; p < spg.pools.size(); ++p) {
          ASSERT_EQ(l.src_pool_group, l.dst_pool_group);  // no snapshot dtype here
          std::memcpy(m->slot_address(l.dst_tier, l.dst_pool_group, p, l.dst_slots[i]),
                      m->slot_address(l.src_tier, l.src_pool_group, p, l.src_slots[i]),
                      spg.pools[p].slot_bytes);
        }
      }
    }
    ASSERT_OK(m->copies_done(b.event));
  }
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// No EngineMemory (the memory is in another process): slot addresses are null, the copies
// are only taken, and a wait returns once another thread reports them done.
TEST(EngineBackend, ASchedulerWithoutMemoryWaitsForTheEnginesReport) {
  std::mt19937_64 rng(4);
  auto m = testing::make_manager(testing::LifecycleModel{}, {BackendKind::kEngine});
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->slot_address(TierKind::kGpu, PoolGroupId{0}, 0, 0), nullptr);
  std::vector<Request> held;
  for (int i = 0; i < 6; ++i) {
    held.push_back(testing::make_request(*m, testing::random_tokens(rng, 700), 600));
    ASSERT_OK(held.back().cache->resume({}));
    ASSERT_OK(held.back().cache->resize(600, 600));
    ASSERT_OK(held.back().cache->suspend());
  }
  ASSERT_OK(held.front().cache->resume({}));
  const CopyEvent ready = held.front().cache->ready_event();
  ASSERT_GT(ready.ticket, 0u) << "the resume onboarded nothing";
  std::thread worker([&] {
    const std::vector<EngineCopyBatch> batches = *m->take_copies();
    ASSERT_FALSE(batches.empty());
    EXPECT_OK(m->copies_done(batches.back().event));
  });
  m->wait(ready);  // returns only after the worker's report
  worker.join();
  EXPECT_TRUE(m->take_copies()->empty());
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST(EngineBackend, MisuseIsRefusedByName) {
  auto host = testing::make_manager(testing::LifecycleModel{}, {BackendKind::kHost});
  ASSERT_NE(host, nullptr);
  const Result<std::vector<EngineCopyBatch>> taken = host->take_copies();
  ASSERT_FALSE(taken.is_ok());
  EXPECT_EQ(taken.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(taken.status().message().find("'host'"), std::string::npos);

  auto m = testing::make_manager(testing::LifecycleModel{}, {BackendKind::kEngine});
  ASSERT_NE(m, nullptr);
  const Status never = m->copies_done({42});
  EXPECT_EQ(never.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(never.message().find("event 42"), std::string::npos) << never.to_string();

  // One HostEngine serves one manager.
  BackendOptions shared = host_engine();
  ASSERT_NE(testing::make_manager(testing::LifecycleModel{}, shared), nullptr);
  const Result<std::unique_ptr<KvCacheManager>> second =
      KvCacheManager::create(testing::lifecycle_config({}), shared);
  ASSERT_FALSE(second.is_ok());
  EXPECT_NE(second.status().message().find("one HostEngine per manager"), std::string::npos);
}

TEST(EngineBackend, TheSharedTierIsRefused) {
  ManagerConfig c = testing::lifecycle_config({});
  c.shared.store = std::make_shared<testing::MemoryStore>(1ull << 20);
  const Result<std::unique_ptr<KvCacheManager>> m =
      KvCacheManager::create(c, {BackendKind::kEngine});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("shared.store"), std::string::npos);
}

// A copy whose page is dropped before the engine takes its batch is left out of the lists.
TEST(EngineBackend, ACopyCancelledBeforeTheTakeIsLeftOut) {
  std::mt19937_64 rng(5);
  testing::LifecycleModel model;
  model.host_quota = 1ull << 20;  // a small host tier: offloaded pages are soon dropped again
  auto m = testing::make_manager(model, {BackendKind::kEngine});
  ASSERT_NE(m, nullptr);
  // Committed and closed requests: their tree pages go down to the host and are dropped there
  // for the next ones, all before the engine takes a batch.
  for (int i = 0; i < 16; ++i) {
    Request r = testing::make_request(*m, testing::random_tokens(rng, 700), 600);
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(r.cache->resize(600, 600));
    ASSERT_OK(r.cache->commit(std::span<const int32_t>(r.fake.tokens[0]).first(600), true));
    ASSERT_OK(r.cache->close());
  }
  const IterationStats stats = m->take_iteration_stats();
  const std::vector<Copy> copies = flatten(*m->take_copies());
  const uint64_t offloads = std::count_if(copies.begin(), copies.end(), [](const Copy& c) {
    return c.src == TierKind::kGpu && c.dst == TierKind::kHost;
  });
  ASSERT_GT(stats.pages_offload_cancelled, 0u) << "no offload was cancelled: no case made";
  EXPECT_EQ(offloads, stats.pages_offloaded - stats.pages_offload_cancelled);
}

// HybridCacheManager hands the copies out with the step: a snapshot commit's state copy
// (GPU -> GPU, from the live state's pool group) comes with the next prepare_step.
TEST(EngineBackend, TheStepCarriesTheCopiesQueuedBeforeIt) {
  ServingConfig s;
  s.max_batch = 2;
  s.tokens_per_block = 16;
  s.tiers = {{TierKind::kGpu, 1ull << 30, ""}};
  auto h = std::move(HybridCacheManager::create(testing::bundled_model("nemotron_h_8b.json", 8), s,
                                                {BackendKind::kEngine}))
               .value();
  std::vector<int32_t> prompt(1100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  ASSERT_OK(h->add_request(1, prompt));
  ASSERT_OK(h->resume(1));
  (void)*h->manager().take_copies();
  const uint64_t point = *h->next_snapshot_point(1);
  ASSERT_OK(h->resize(1, point, 0));
  ASSERT_OK(h->resize(1, point, point));
  ASSERT_OK(h->commit_at_snapshot(1));
  const std::vector<uint64_t> ids = {1};
  Result<HybridCacheManager::Step> step = h->prepare_step(ids, 0);
  ASSERT_TRUE(step.is_ok()) << step.status().to_string();
  const PoolGroupId state = h->plan().cache_group(*h->state_group()).pool_group;
  bool state_copy = false;
  for (const Copy& c : flatten(step->copies)) {
    if (c.src == TierKind::kGpu && c.dst == TierKind::kGpu && c.pool_group == state) {
      state_copy = true;
      EXPECT_EQ(static_cast<int32_t>(c.src_slot), step->entries[0].state_index);
    }
  }
  EXPECT_TRUE(state_copy) << "the snapshot's state copy did not come with the step";
  ASSERT_FALSE(step->copies.empty());
  ASSERT_OK(h->manager().copies_done(step->copies.back().event));
  EXPECT_TRUE(h->prepare_step(ids, 0)->copies.empty());
}

}  // namespace
}  // namespace hybridkv
