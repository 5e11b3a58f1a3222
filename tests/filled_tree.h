// A lifecycle manager whose GPU tier is full of freed prompts the tree keeps (tests of the
// eviction order: evict_ahead_test, touch_reuse_test). The oldest prompt is first in line to go.
#pragma once

#include <random>
#include <vector>

#include "lifecycle_fixture.h"

namespace hybridkv::testing {

struct FilledTree {
  static constexpr uint64_t kPrompt = 160;

  std::unique_ptr<KvCacheManager> m = make_manager(LifecycleModel{});
  FakeEngine engine{*m};

  PoolGroupId attention() const {
    for (const CacheGroup& g : m->plan().cache_groups()) {
      if (g.kind == GroupKind::kAttention) return g.pool_group;
    }
    return PoolGroupId(0);
  }
  uint64_t gpu_free(PoolGroupId pg) const {
    return m->storage_stats().tiers[0].pool_groups[pg.value].free_slots;
  }
  // Prompts computed, committed with their snapshot and freed until the GPU's attention pool
  // group has fewer than `free` free slots: the tree holds the rest, ready to be evicted.
  std::vector<std::vector<int32_t>> fill(uint64_t free, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int32_t>> prompts;
    while (gpu_free(attention()) >= free && prompts.size() < 200) {
      prompts.push_back(random_tokens(rng, kPrompt));
      Request r = make_request(*m, prompts.back(), kPrompt);
      EXPECT_OK(resume_compute_commit(engine, r, kPrompt));
    }
    return prompts;
  }
  // evict_ahead's free_slots: `attention_free` for the attention pool group, 0 elsewhere.
  std::vector<uint64_t> want(uint64_t attention_free) const {
    std::vector<uint64_t> w(m->plan().pool_groups().size(), 0);
    w[attention().value] = attention_free;
    return w;
  }
};

}  // namespace hybridkv::testing
