// Calls serving engines make (issue 11, items 13-15): prefetch ahead of resume, per-group and
// per-step statistics with get-and-reset, reuse coverage as token ranges, runtime quotas.
#include <gtest/gtest.h>

#include <string>

#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::advance;
using testing::LifecycleModel;
using testing::make_manager;
using testing::make_request;
using testing::random_tokens;
using testing::Request;

constexpr PoolGroupId kAttentionPool(2);  // full and window groups share it

size_t pages_on_host(const KvCacheManager& m) {
  const std::string snap = testing::debug_snapshot(m);
  size_t n = 0;
  for (size_t at = snap.find(" HOST:"); at != std::string::npos; at = snap.find(" HOST:", at + 1))
    ++n;
  return n;
}

class EngineCalls : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{77};
};

TEST_F(EngineCalls, PrefetchOnboardsASuspendedCacheSoResumeOnlyWaits) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 200), 160);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 160));
  ASSERT_OK(a.cache->suspend());
  // B takes every free attention slot and twelve more: twelve of A's pages go to the host.
  Request b = make_request(*m, random_tokens(rng_, 5000), 5000);
  ASSERT_OK(b.cache->resume({}));
  const uint64_t free_now =
      m->storage_stats().tiers[0].pool_groups[kAttentionPool.value].free_slots;
  ASSERT_EQ((free_now + 12) % 2, 0u);  // full and window blocks come in pairs at history 0
  ASSERT_OK(b.cache->resize((free_now + 12) / 2 * 16, 0));
  const size_t away = pages_on_host(*m);
  ASSERT_EQ(away, 12u);
  // While B holds the whole GPU, a prefetch finds no room: refused, nothing changes.
  const std::string before = testing::debug_snapshot(*m);
  const Status full = a.cache->prefetch();
  EXPECT_EQ(full.code(), StatusCode::kOutOfPages) << full.to_string();
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  ASSERT_OK(b.cache->close());
  (void)m->take_iteration_stats();
  // The prefetch brings the twelve back; A stays SUSPENDED (its pages HELD).
  ASSERT_OK(a.cache->prefetch());
  EXPECT_EQ(a.cache->state(), CacheState::kSuspended);
  EXPECT_EQ(m->take_iteration_stats().pages_onboarded, 12u);
  EXPECT_EQ(pages_on_host(*m), 0u);
  ASSERT_OK(a.cache->prefetch());  // nothing left to do
  EXPECT_EQ(m->take_iteration_stats().pages_onboarded, 0u);
  // The resume copies nothing more: it waits on the prefetch's copies, and every byte is there.
  ASSERT_OK(a.cache->resume({}));
  EXPECT_EQ(m->take_iteration_stats().pages_onboarded, 0u);
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  EXPECT_EQ(a.cache->prefetch().code(), StatusCode::kFailedPrecondition);  // ACTIVE
  EXPECT_EQ(testing::check_invariants(*m), "");
}

}  // namespace
}  // namespace hybridkv
