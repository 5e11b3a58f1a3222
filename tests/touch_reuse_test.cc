// KvCacheManager::touch_reuse: a scheduler marks the prefixes of the requests it will admit
// next as the most recently used, so that the traffic admitted before them does not evict them
// first (issue 35: reuse). It moves pages within their eviction queues and nothing else: no
// reference, no lookup counted, no byte moved; eviction then takes other pages first.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <set>

#include "filled_tree.h"
#include "hybridkv/testing/inspect.h"

namespace hybridkv {
namespace {

using testing::make_request;
using testing::random_tokens;
using testing::Request;

constexpr uint64_t kPrompt = testing::FilledTree::kPrompt;

// A later turn of `prompt`: what a request that reuses all of it sends.
std::vector<int32_t> next_turn(const std::vector<int32_t>& prompt) {
  std::vector<int32_t> longer = prompt;
  longer.resize(prompt.size() + 20, 5);
  return longer;
}

struct Instance : testing::FilledTree {
  std::vector<std::vector<int32_t>> fill(uint64_t seed) { return FilledTree::fill(8, seed); }
  // GPU room for `blocks` more attention pages, made ahead (the eviction order decides).
  void evict(uint64_t blocks) {
    ASSERT_OK(m->evict_ahead(want(gpu_free(attention()) + blocks), 1000).status());
  }
  // Bytes a request for `prompt` brings up from a colder tier when it resumes.
  uint64_t onboarded_to_resume(const std::vector<int32_t>& prompt) {
    const std::vector<int32_t> longer = next_turn(prompt);
    Request r = make_request(*m, longer, longer.size());
    EXPECT_EQ(r.cache->reuse_match().reused_tokens, kPrompt);
    (void)m->take_iteration_stats();
    EXPECT_OK(r.cache->resume({}));
    EXPECT_OK(engine.verify(*r.cache, r.fake));
    return m->take_iteration_stats().bytes_onboarded;
  }
};

// The keys of the attention pages the tree keeps on the GPU.
std::set<BlockKey> gpu_attention(const Instance& i) {
  std::set<BlockKey> keys;
  for (const testing::TreePage& t : testing::tree_pages(*i.m)) {
    if (t.tier == TierKind::kGpu && t.pool_group == i.attention()) keys.insert(t.key);
  }
  return keys;
}

std::set<BlockKey> minus(const std::set<BlockKey>& a, const std::set<BlockKey>& b) {
  std::set<BlockKey> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

TEST(TouchReuse, ATouchedPrefixLeavesTheGpuAfterTheOthers) {
  Instance touched, plain;
  const std::vector<std::vector<int32_t>> prompts = touched.fill(11);
  ASSERT_EQ(plain.fill(11), prompts);
  ASSERT_GE(prompts.size(), 3u);
  const std::set<BlockKey> before = gpu_attention(plain);
  ASSERT_EQ(gpu_attention(touched), before);
  // The oldest prompt is LRU's first victim; one manager is told it is wanted next.
  Result<ReuseMatch> m = touched.m->touch_reuse({}, next_turn(prompts.front()));
  ASSERT_OK(m.status());
  EXPECT_EQ(m->reused_tokens, kPrompt);
  const uint64_t blocks = kPrompt / touched.m->plan().config().tokens_per_block;
  touched.evict(blocks);  // room for one prompt
  plain.evict(blocks);
  const std::set<BlockKey> gone_plain = minus(before, gpu_attention(plain));
  const std::set<BlockKey> gone_touched = minus(before, gpu_attention(touched));
  ASSERT_FALSE(gone_plain.empty());
  ASSERT_FALSE(gone_touched.empty());
  // Untouched, the oldest prompt's blocks went down a tier; touched, others went instead.
  EXPECT_EQ(minus(gone_plain, gone_touched), gone_plain) << "a touched block left the GPU";
  // Both still resume the oldest prompt with the bytes the engine wrote (from wherever they are).
  (void)plain.onboarded_to_resume(prompts.front());
  (void)touched.onboarded_to_resume(prompts.front());
  EXPECT_EQ(testing::check_invariants(*touched.m), "");
}

TEST(TouchReuse, TakesNoReferenceCountsNoLookupAndMovesNoPage) {
  Instance a;
  const std::vector<std::vector<int32_t>> prompts = a.fill(21);
  const ReuseStats stats = a.m->reuse_stats();
  const std::vector<testing::TreePage> pages = testing::tree_pages(*a.m);
  const std::vector<int32_t> turn = next_turn(prompts[1]);
  std::shared_ptr<const PromptKeys> keys = a.m->hash_prompt({}, turn);
  Result<ReuseMatch> m = a.m->touch_reuse({}, turn, keys.get());
  ASSERT_OK(m.status());
  EXPECT_EQ(m->reused_tokens, kPrompt);
  EXPECT_EQ(a.m->probe_reuse({}, turn).reused_tokens, kPrompt);
  const ReuseStats now = a.m->reuse_stats();
  ASSERT_EQ(now.groups.size(), stats.groups.size());
  for (size_t g = 0; g < stats.groups.size(); ++g) {
    EXPECT_EQ(now.groups[g].lookups, stats.groups[g].lookups);
    EXPECT_EQ(now.groups[g].served_by_tier, stats.groups[g].served_by_tier);
  }
  EXPECT_EQ(now.pages_served_by_tier, stats.pages_served_by_tier);
  const std::vector<testing::TreePage> after = testing::tree_pages(*a.m);
  ASSERT_EQ(after.size(), pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(after[i].tier, pages[i].tier);
    EXPECT_EQ(after[i].slot, pages[i].slot);
  }
  EXPECT_EQ(a.m->storage_stats().tiers[0].pool_groups[a.attention().value].free_slots,
            a.gpu_free(a.attention()));
  EXPECT_EQ(testing::check_invariants(*a.m), "");
  // A prompt the tree does not hold touches nothing and reuses nothing.
  std::mt19937_64 rng(5);
  const std::string before = testing::debug_snapshot(*a.m);
  Result<ReuseMatch> none = a.m->touch_reuse({}, random_tokens(rng, kPrompt));
  ASSERT_OK(none.status());
  EXPECT_EQ(none->reused_tokens, 0u);
  EXPECT_EQ(testing::debug_snapshot(*a.m), before);
}

TEST(TouchReuse, KeysOfAnotherPromptAreRefusedAndChangeNothing) {
  Instance a;
  const std::vector<std::vector<int32_t>> prompts = a.fill(31);
  std::shared_ptr<const PromptKeys> keys = a.m->hash_prompt({}, prompts[0]);
  const std::string before = testing::debug_snapshot(*a.m);
  Result<ReuseMatch> m = a.m->touch_reuse({}, prompts[1], keys.get());
  ASSERT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("prompt_keys"), std::string::npos) << m.status().message();
  EXPECT_EQ(testing::debug_snapshot(*a.m), before);
}

// A page an ACTIVE request holds is in no queue: touching its prefix leaves it where it is,
// and the request computes on with the bytes it had.
TEST(TouchReuse, APrefixAnActiveRequestHoldsIsLeftAsItIs) {
  Instance a;
  const std::vector<std::vector<int32_t>> prompts = a.fill(41);
  const std::vector<int32_t> longer = next_turn(prompts[2]);
  Request r = make_request(*a.m, longer, longer.size());
  ASSERT_OK(r.cache->resume({}));
  Result<ReuseMatch> m = a.m->touch_reuse({}, longer);
  ASSERT_OK(m.status());
  EXPECT_EQ(m->reused_tokens, kPrompt);
  EXPECT_EQ(testing::check_invariants(*a.m), "");
  ASSERT_OK(testing::advance(a.engine, r, longer.size()));
  ASSERT_OK(a.engine.verify(*r.cache, r.fake));
}

}  // namespace
}  // namespace hybridkv
