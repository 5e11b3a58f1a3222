// What the shared-tier tests share: managers of the lifecycle model on one store (Redis in
// shared_tier_test, in memory in shared_memory_test), one that serves and publishes a prompt,
// another that fetches it and checks every reused page with the fake engine.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cache/shared_tier.h"
#include "hybridkv/shared_object.h"
#include "lifecycle_fixture.h"
#include "prefix/block_hash.h"

namespace hybridkv::testing {

inline constexpr uint32_t kSharedTpb = 16;
inline constexpr CacheGroupId kSharedSsm(0), kSharedFull(2);

class SharedFixture : public ::testing::Test {
 protected:
  ManagerConfig config() const {
    LifecycleModel m;
    m.host_quota = 8ull << 20;
    ManagerConfig c = lifecycle_config(m);
    c.shared.store = store_;
    c.shared.model_id = "lifecycle-test";
    return c;
  }
  std::unique_ptr<KvCacheManager> manager(BackendOptions backend = {BackendKind::kHost}) const {
    return std::move(KvCacheManager::create(config(), backend)).value();
  }

  // One instance serves `tokens[0, end)` committing at each of `commits` (snapshots there).
  static Status serve(KvCacheManager& m, const std::vector<int32_t>& tokens,
                      const std::vector<uint64_t>& commits) {
    FakeEngine engine(m);
    Request r = make_request(m, tokens, commits.back());
    if (Status s = r.cache->resume({}); !s) return s;
    for (uint64_t at : commits) {
      if (Status s = advance(engine, r, at); !s) return s;
      if (Status s = commit_computed(r); !s) return s;
    }
    if (Status s = r.cache->close(); !s) return s;
    m.flush_shared();
    return Status::ok();
  }

  // Another instance fetches the prompt, creates its request and checks every reused page.
  static uint64_t fetch_and_verify(KvCacheManager& m, const std::vector<int32_t>& tokens,
                                   SharedFetch* fetch = nullptr) {
    Result<SharedFetch> f = m.fetch_shared({}, std::span(tokens).first(250));
    EXPECT_TRUE(f.is_ok()) << f.status().to_string();
    if (fetch != nullptr && f.is_ok()) *fetch = *f;
    FakeEngine engine(m);
    Request r = make_request(m, tokens, 250);
    const uint64_t reused = r.cache->reuse_match().reused_tokens;
    EXPECT_EQ(reused, f.is_ok() ? f->hit_tokens : 0);
    EXPECT_TRUE(r.cache->resume({}).is_ok());
    const Status v = engine.verify(*r.cache, r.fake);
    EXPECT_TRUE(v.is_ok()) << v.to_string();
    EXPECT_TRUE(advance(engine, r, 300).is_ok());  // and it computes on from there
    EXPECT_EQ(check_invariants(m), "");
    return reused;
  }

  // The store key of block `b` of `group` of `tokens` (what every instance computes).
  std::string key(const std::vector<int32_t>& tokens, uint64_t b, CacheGroupId group,
                  bool modelled = false) const {
    const Result<StoragePlan> plan = StoragePlan::build(config());
    prefix::BlockHasher hasher(BlockHash::kSha256);
    BlockKey chain = hasher.root({});
    for (uint64_t i = 0; i <= b; ++i)
      chain = hasher.key(chain, std::span(tokens).subspan(i * kSharedTpb, kSharedTpb));
    uint64_t digest = 0;
    std::memcpy(&digest, chain.data(), sizeof digest);
    const SharedObjectKind kind =
        group == kSharedSsm ? SharedObjectKind::kSnapshot : SharedObjectKind::kKvBlock;
    return shared_object_key(cache_detail::layout_fingerprint(*plan, "lifecycle-test", modelled), 0,
                             kind, group.value, digest);
  }

  std::mt19937_64 rng_{33};
  std::shared_ptr<SharedStore> store_;
};

}  // namespace hybridkv::testing
