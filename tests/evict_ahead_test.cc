// KvCacheManager::evict_ahead: GPU room freed while the GPU computes a step, so that the next
// step's allocations find it free (issue 35 item 4: the worst step). It must take exactly the
// victims the allocations would have taken, keep every moved page's bytes, and stop cleanly.
#include <gtest/gtest.h>

#include <algorithm>

#include "filled_tree.h"
#include "hybridkv/testing/inspect.h"

namespace hybridkv {
namespace {

using testing::make_request;
using testing::random_tokens;
using testing::Request;

using Instance = testing::FilledTree;
constexpr uint64_t kPrompt = Instance::kPrompt;

// Where every tree page sits (tier, slot) by key and group: two managers that took the same
// decisions agree on all of it.
std::vector<std::tuple<BlockKey, uint32_t, TierKind, uint32_t>> placement(const KvCacheManager& m) {
  std::vector<std::tuple<BlockKey, uint32_t, TierKind, uint32_t>> out;
  for (const testing::TreePage& t : testing::tree_pages(m))
    out.emplace_back(t.key, t.group.value, t.tier, t.slot);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(EvictAhead, FreesTheRoomAskedForAndTheBytesComeBack) {
  Instance a;
  const std::vector<std::vector<int32_t>> prompts = a.fill(8, 11);
  const PoolGroupId pg = a.attention();
  const uint64_t before = a.gpu_free(pg);
  auto on_host = [&] {
    const std::vector<testing::TreePage> pages = testing::tree_pages(*a.m);
    return std::count_if(pages.begin(), pages.end(),
                         [](const testing::TreePage& t) { return t.tier == TierKind::kHost; });
  };
  const auto host_before = on_host();
  Result<uint64_t> evicted = a.m->evict_ahead(a.want(before + 12), 1000);
  ASSERT_OK(evicted.status());
  EXPECT_EQ(*evicted, 12u);  // each eviction frees one slot
  EXPECT_EQ(a.gpu_free(pg), before + 12);
  EXPECT_GT(on_host(), host_before);  // moved down, not dropped
  EXPECT_EQ(testing::check_invariants(*a.m), "");
  // Asked again: the room is there, nothing more goes.
  EXPECT_EQ(*a.m->evict_ahead(a.want(before + 12), 1000), 0u);
  // The oldest prompt's pages went first (moved down to the host tier): it resumes from there
  // with the bytes the engine wrote.
  std::vector<int32_t> longer = prompts.front();
  longer.resize(kPrompt + 20, 5);
  Request r = make_request(*a.m, longer, longer.size());
  EXPECT_EQ(r.cache->reuse_match().reused_tokens, kPrompt);
  ASSERT_OK(r.cache->resume({}));
  ASSERT_OK(a.engine.verify(*r.cache, r.fake));
  EXPECT_EQ(testing::check_invariants(*a.m), "");
}

TEST(EvictAhead, TakesTheVictimsTheNextAllocationWouldHaveTaken) {
  Instance ahead, plain;
  ahead.fill(4, 21);
  plain.fill(4, 21);
  ASSERT_EQ(placement(*ahead.m), placement(*plain.m));
  // The next request needs kPrompt tokens of attention pages: one manager frees them ahead.
  const uint64_t tpb = ahead.m->plan().config().tokens_per_block;
  const uint64_t blocks = (kPrompt + tpb - 1) / tpb;
  const uint64_t free = ahead.gpu_free(ahead.attention());
  ASSERT_OK(ahead.m->evict_ahead(ahead.want(free + blocks), 1000).status());
  std::mt19937_64 rng(99);
  const std::vector<int32_t> next = random_tokens(rng, kPrompt);
  for (Instance* i : {&ahead, &plain}) {
    Request r = make_request(*i->m, next, kPrompt);
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(testing::advance(i->engine, r, kPrompt));
    ASSERT_OK(i->engine.verify(*r.cache, r.fake));
  }
  EXPECT_EQ(placement(*ahead.m), placement(*plain.m));
}

TEST(EvictAhead, StopsAtItsBudgetAndWhenNothingIsLeftToEvict) {
  Instance a;
  a.fill(8, 31);
  const PoolGroupId pg = a.attention();
  const uint64_t before = a.gpu_free(pg);
  EXPECT_EQ(*a.m->evict_ahead(a.want(before + 50), 3), 3u);
  EXPECT_EQ(a.gpu_free(pg), before + 3);
  // More than the pool group holds: everything evictable goes, then it stops.
  const StorageStats st = a.m->storage_stats();
  const PoolGroupStorage& gpu = st.tiers[0].pool_groups[pg.value];
  Result<uint64_t> all = a.m->evict_ahead(a.want(gpu.total_slots + 1), UINT64_MAX);
  ASSERT_OK(all.status());
  EXPECT_EQ(*all, gpu.evictable_slots);
  EXPECT_EQ(a.gpu_free(pg), gpu.free_slots + gpu.evictable_slots);
  EXPECT_EQ(testing::check_invariants(*a.m), "");
}

TEST(EvictAhead, AWrongNumberOfPoolGroupsIsRefusedAndChangesNothing) {
  Instance a;
  a.fill(8, 41);
  const auto before = placement(*a.m);
  const std::vector<uint64_t> one{1000};
  Result<uint64_t> r = a.m->evict_ahead(one, 1000);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("free_slots has 1 entries"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(placement(*a.m), before);
}

}  // namespace
}  // namespace hybridkv
