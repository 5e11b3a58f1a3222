// The KvCache lifecycle through the fake engine: tiers, eviction, all-or-nothing failures,
// windows, beams, bounds, index buffers, priorities, copy ordering and threads.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <thread>

#include "hybridkv/testing/fault_env.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::advance;
using testing::LifecycleModel;
using testing::make_manager;
using testing::make_request;
using testing::random_tokens;
using testing::Request;

constexpr CacheGroupId kSsm(0), kPrivate(1), kFull(2), kWindow(3);

std::vector<int32_t> table_of(const KvCache& cache, CacheGroupId group, uint32_t beam = 0) {
  Result<std::span<const int32_t>> t = cache.block_table(group, beam);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return t.is_ok() ? std::vector<int32_t>(t->begin(), t->end()) : std::vector<int32_t>{};
}

class Lifecycle : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(1234); }
  void expect_clean(const KvCacheManager& m) { EXPECT_EQ(testing::check_invariants(m), ""); }
  std::mt19937_64 rng_;
};

TEST_F(Lifecycle, TestModelPlansFourGroupsInThreePoolGroups) {
  auto m = make_manager(LifecycleModel{});
  const StoragePlan& plan = m->plan();
  ASSERT_EQ(plan.cache_groups().size(), 4u);
  EXPECT_EQ(plan.cache_group(kPrivate).policy, ReusePolicy::kPrivate);
  EXPECT_EQ(plan.cache_group(kWindow).window, 48u);
  EXPECT_EQ(plan.pool_groups().size(), 3u);  // full and window share [8192]
  // Rounding leftovers give the state pool group a sixth slot... and a seventh: 7.
  EXPECT_EQ(plan.slots(TierKind::kGpu, PoolGroupId(0)), 7u);
  // The default batch (32 at history 2047) weighs full attention 128 blocks and the 48-token
  // window 3 (tokens 2000..2047: blocks 125..127) per request.
  EXPECT_EQ(plan.slots(TierKind::kGpu, PoolGroupId(2)), 238u);
}

TEST_F(Lifecycle, ComputeSuspendResumeKeepsEveryByte) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request r = make_request(*m, random_tokens(rng_, 300), 200);
  ASSERT_OK(r.cache->resume({}));
  ASSERT_OK(advance(engine, r, 200));
  ASSERT_OK(advance(engine, r, 201));
  ASSERT_OK(r.cache->suspend());
  EXPECT_EQ(*r.cache->state_index(kSsm), kBadPageIndex);
  ASSERT_OK(r.cache->resume({}));
  ASSERT_OK(engine.verify(*r.cache, r.fake));
  ASSERT_OK(advance(engine, r, 250));
  expect_clean(*m);
  ASSERT_OK(r.cache->close());
  expect_clean(*m);
  const StorageStats stats = m->storage_stats();
  for (const PoolGroupStorage& pg : stats.tiers[0].pool_groups)
    EXPECT_EQ(pg.free_slots, pg.total_slots);
}

TEST_F(Lifecycle, SuspendedPagesMoveToHostAndComeBackIntoOtherSlots) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 700), 600);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 600));
  ASSERT_OK(a.cache->suspend());
  (void)m->take_iteration_stats();

  // Others take the GPU: A's held pages are demoted to the host tier.
  std::vector<Request> others;
  for (int i = 0; i < 5; ++i) {
    others.push_back(make_request(*m, random_tokens(rng_, 700), 600));
    Request& o = others.back();
    ASSERT_TRUE(o.cache->resume({}).is_ok()) << i;
    ASSERT_TRUE(advance(engine, o, 600).is_ok()) << i;
    ASSERT_OK(o.cache->suspend());
  }
  const IterationStats offload = m->take_iteration_stats();
  EXPECT_GT(offload.pages_offloaded, 0u);
  EXPECT_GT(offload.bytes_offloaded, 0u);

  ASSERT_OK(a.cache->resume({}));
  const IterationStats onboard = m->take_iteration_stats();
  EXPECT_GT(onboard.pages_onboarded, 0u);
  EXPECT_EQ(onboard.resumes, 1u);
  // Attention, SSM and PRIVATE pages all came back, and the fake engine finds every byte.
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  // (The randomized test counts how often resumed pages land in other slots.)
  ASSERT_OK(advance(engine, a, 650));
  expect_clean(*m);
}

TEST_F(Lifecycle, RefusedResumeLeavesCacheSuspendedAndNothingChanged) {
  LifecycleModel model;
  model.host_quota = 0;  // nowhere to demote: held states keep the 7 GPU SSM slots
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  std::vector<Request> held;
  Status refused;
  for (int i = 0; i < 10 && refused.is_ok(); ++i) {
    held.push_back(make_request(*m, random_tokens(rng_, 40), 40));
    Request& r = held.back();
    const std::string before = testing::debug_snapshot(*m);
    // can_resume() answers what resume() will, and changes nothing either way.
    const Status asked = r.cache->can_resume();
    EXPECT_EQ(testing::debug_snapshot(*m), before);
    refused = r.cache->resume({});
    EXPECT_EQ(asked.code(), refused.code()) << asked.to_string() << " / " << refused.to_string();
    EXPECT_EQ(asked.message(), refused.message());
    if (!refused.is_ok()) {
      EXPECT_EQ(testing::debug_snapshot(*m), before);
      EXPECT_EQ(r.cache->state(), CacheState::kSuspended);
      EXPECT_EQ(i, 7);
      break;
    }
    ASSERT_OK(advance(engine, r, 40));
    ASSERT_OK(r.cache->suspend());
  }
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.code(), StatusCode::kOutOfPages) << refused.to_string();
  EXPECT_NE(refused.message().find("resume: pool group 0 (GPU) needs 1 more slots; 0 of 7"),
            std::string::npos)
      << refused.message();
  EXPECT_EQ(m->take_iteration_stats().refused_resumes, 1u);
  expect_clean(*m);
  // The held requests are intact.
  held.pop_back();
  for (Request& r : held) {
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(r.cache->close());
  }
}

TEST_F(Lifecycle, ResumeIsRefusedAboveUtilGate) {
  LifecycleModel model;
  model.host_quota = 0;
  auto m = make_manager(model);
  // 7 SSM slots at 0.97: six requests may be active, the seventh resume is refused by the gate.
  std::vector<Request> active;
  for (int i = 0; i < 6; ++i) {
    active.push_back(make_request(*m, random_tokens(rng_, 10), 10));
    ASSERT_TRUE(active.back().cache->resume({}).is_ok()) << i;
  }
  Request extra = make_request(*m, random_tokens(rng_, 10), 10);
  const std::string before = testing::debug_snapshot(*m);
  const Status s = extra.cache->resume({});
  EXPECT_EQ(s.code(), StatusCode::kRefused) << s.to_string();
  EXPECT_NE(s.message().find("pool group 0 (GPU) would have 7 of 7 slots locked"),
            std::string::npos)
      << s.message();
  // Its fresh state page alone fails the gate: refused without reading its pages.
  EXPECT_NE(s.message().find("counting only its fresh pages"), std::string::npos) << s.message();
  EXPECT_EQ(extra.cache->can_resume({}).message(), s.message());
  EXPECT_EQ(testing::debug_snapshot(*m), before);
}

// A suspended request asked about every step stops reading its pages where the gate fails
// (the refusal names a lower bound); the answer is the one the whole walk gives, and once the
// others let go it resumes with every byte.
TEST_F(Lifecycle, ARefusedResumeStopsReadingItsPagesWhereTheGateFails) {
  LifecycleModel model;
  model.window = 0;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 1600), 1600);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 1600));  // 100 attention pages
  ASSERT_OK(a.cache->suspend());
  Request b = make_request(*m, random_tokens(rng_, 2400), 2400);
  ASSERT_OK(b.cache->resume({}));
  ASSERT_OK(advance(engine, b, 2400));  // 150 pages locked, A's moved down to make room
  const std::string before = testing::debug_snapshot(*m);
  const Status can = a.cache->can_resume({});
  EXPECT_EQ(can.code(), StatusCode::kRefused) << can.to_string();
  EXPECT_NE(can.message().find("(GPU) would have at least "), std::string::npos) << can.message();
  const Status s = a.cache->resume({});
  EXPECT_EQ(s.message(), can.message());
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  expect_clean(*m);
  ASSERT_OK(b.cache->close());
  ASSERT_OK(a.cache->can_resume({}));
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  ASSERT_OK(a.cache->close());
  expect_clean(*m);
}

TEST_F(Lifecycle, OutOfPagesInResizeRollsBackExactly) {
  LifecycleModel model;
  model.host_quota = 0;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 5000), 100);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 100));
  const std::string before = testing::debug_snapshot(*m);
  // 238 attention slots; the window needs 4 of them: 236 full blocks do not fit.
  const Status s = a.cache->resize(236 * 16, 100);
  ASSERT_EQ(s.code(), StatusCode::kOutOfPages) << s.to_string();
  EXPECT_NE(s.message().find("resize: pool group 2 (GPU) needs"), std::string::npos) << s.message();
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  EXPECT_EQ(a.cache->capacity(), 100u);
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  expect_clean(*m);
}

TEST_F(Lifecycle, QuotaTooSmallForOneRequestFailsNamingThePoolGroup) {
  auto m = make_manager(LifecycleModel{});
  Request a = make_request(*m, random_tokens(rng_, 10), 10);
  ASSERT_OK(a.cache->resume({}));
  const Status s = a.cache->resize(1'000'000, 0);
  ASSERT_EQ(s.code(), StatusCode::kOutOfPages);
  EXPECT_NE(s.message().find("pool group 2"), std::string::npos) << s.message();
  EXPECT_EQ(a.cache->capacity(), 0u);
}

// Issue 36: a resize to a capacity no GPU could hold ran for as long as the capacity was large
// (2^63: for ever, holding the manager's lock). It is refused before any block is counted, with
// nothing changed.
TEST_F(Lifecycle, ACapacityNoGpuHoldsIsRefusedAtOnce) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 40), 40);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 40));
  const std::string before = testing::debug_snapshot(*m);
  for (uint64_t capacity : {uint64_t{1} << 20, uint64_t{1} << 31, uint64_t{1} << 63, UINT64_MAX}) {
    const Status s = a.cache->resize(capacity, 40);
    ASSERT_FALSE(s.is_ok()) << capacity;
    EXPECT_NE(s.message().find("resize: capacity " + std::to_string(capacity)), std::string::npos)
        << s.message();
    EXPECT_EQ(testing::debug_snapshot(*m), before);
  }
  ASSERT_OK(engine.verify(*a.cache, a.fake));
}

// One decode step's growth as one operation: a cache listed twice, one not ACTIVE, or too little
// room for all of them, and nothing changed; otherwise every cache grew.
TEST_F(Lifecycle, ResizeAllIsAllOrNothing) {
  LifecycleModel model;
  model.host_quota = 0;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(make_request(*m, random_tokens(rng_, 128), 64));
    ASSERT_OK(reqs.back().cache->resume({}));
    ASSERT_OK(advance(engine, reqs.back(), 64));
  }
  auto grow = [&](std::vector<size_t> which, uint64_t by) {
    std::vector<CacheResize> rs;
    for (size_t i : which) {
      KvCache* c = reqs[i].cache.get();  // the last step computed up to capacity
      rs.push_back({c, c->capacity() + by, c->capacity()});
    }
    return m->resize_all(rs);
  };
  std::string before = testing::debug_snapshot(*m);
  Status s = grow({0, 1, 0}, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("appears at positions 0 and 2"), std::string::npos) << s.message();
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  ASSERT_OK(reqs[2].cache->suspend());
  before = testing::debug_snapshot(*m);
  s = grow({0, 2}, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  // Each alone fits; the three together do not: refused whole.
  ASSERT_OK(reqs[2].cache->resume({}));
  const uint64_t free_blocks = m->storage_stats().tiers[0].pool_groups[2].free_slots +
                               m->storage_stats().tiers[0].pool_groups[2].evictable_slots;
  const uint64_t each = (free_blocks / 2) * 16;
  before = testing::debug_snapshot(*m);
  s = grow({0, 1, 2}, each);
  EXPECT_EQ(s.code(), StatusCode::kOutOfPages) << s.to_string();
  EXPECT_NE(s.message().find("the 3 caches together; nothing changed"), std::string::npos)
      << s.message();
  EXPECT_EQ(testing::debug_snapshot(*m), before);
  ASSERT_OK(grow({0, 1, 2}, 16));
  for (Request& r : reqs) {
    EXPECT_EQ(r.cache->capacity(), 80u);
    ASSERT_OK(engine.step(*r.cache, r.fake, 80));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
  }
  expect_clean(*m);
}

TEST_F(Lifecycle, SlidingWindowReleasesStaleBlocks) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 400), 10);
  ASSERT_OK(a.cache->resume({}));
  for (uint64_t t = 16; t <= 320; t += 16) ASSERT_OK(advance(engine, a, t));
  ASSERT_OK(a.cache->resize(320, 320));
  // history 320, window 48: tokens from 272 on are read -> blocks 17.. stay, 0..16 are released.
  const auto window = table_of(*a.cache, kWindow);
  ASSERT_EQ(window.size(), 20u);
  for (size_t b = 0; b < 17; ++b) EXPECT_EQ(window[b], kBadPageIndex) << b;
  for (size_t b = 17; b < 20; ++b) EXPECT_NE(window[b], kBadPageIndex) << b;
  for (int32_t slot : table_of(*a.cache, kFull)) EXPECT_NE(slot, kBadPageIndex);
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  expect_clean(*m);
}

// A decode step inside the blocks a cache has (no window group) changes no page: only capacity
// and history move; the step that crosses into a new block allocates it.
TEST_F(Lifecycle, AResizeInsideItsBlocksChangesOnlyCapacityAndHistory) {
  LifecycleModel model;
  model.window = 0;
  auto m = make_manager(model);
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 100), 40);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 40));
  for (uint64_t t = 41; t <= 48; ++t) {  // tokens 40..47 fill block 2 (16 tokens a block)
    std::string before = testing::debug_snapshot(*m);
    const std::string was = "cap " + std::to_string(a.cache->capacity()) + " hist " +
                            std::to_string(a.cache->history());
    const size_t at = before.find(was);
    ASSERT_NE(at, std::string::npos) << before;
    before.replace(at, was.size(), "cap " + std::to_string(t) + " hist " + std::to_string(t - 1));
    ASSERT_OK(a.cache->resize(t, t - 1));
    EXPECT_EQ(testing::debug_snapshot(*m), before) << "token " << t;
    ASSERT_OK(engine.step(*a.cache, a.fake, t));
  }
  const size_t blocks = table_of(*a.cache, kFull).size();
  ASSERT_OK(advance(engine, a, 49));  // token 48 starts block 3
  EXPECT_EQ(table_of(*a.cache, kFull).size(), blocks + 1);
  EXPECT_NE(table_of(*a.cache, kFull).back(), kBadPageIndex);
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  expect_clean(*m);
}

TEST_F(Lifecycle, BeamsGetTheirOwnPagesPastThePrompt) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 100), 40, 3);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 40));
  ASSERT_OK(advance(engine, a, 90));
  const auto b0 = table_of(*a.cache, kFull, 0);
  const auto b1 = table_of(*a.cache, kFull, 1);
  EXPECT_EQ(b0[0], b1[0]);  // the prompt's full blocks are shared
  EXPECT_EQ(b0[1], b1[1]);
  EXPECT_NE(b0[2], b1[2]);  // block 2 holds tokens 32..47: past the prompt's full blocks
  EXPECT_NE(*a.cache->state_index(kSsm, 0), *a.cache->state_index(kSsm, 2));
  ASSERT_OK(a.cache->suspend());
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  EXPECT_FALSE(a.cache->block_table(kFull, 3).is_ok());
  expect_clean(*m);
}

TEST_F(Lifecycle, BeamsAreRefusedWithAFixedPrivatePool) {
  LifecycleModel model;
  model.max_live = 4;
  auto m = make_manager(model);
  CacheOptions o;
  o.beam_width = 2;
  Result<std::unique_ptr<KvCache>> c = m->create_kv_cache(o);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kRefused);
  EXPECT_NE(c.status().message().find("fixed PRIVATE pool"), std::string::npos);
}

// create_kv_cache(CacheOptions&&): the prompt moves into the cache; a refusal takes nothing.
TEST_F(Lifecycle, MovedOptionsGiveTheCacheItsPromptAndARefusalKeepsThem) {
  LifecycleModel model;
  model.max_live = 4;
  auto m = make_manager(model);
  const std::vector<int32_t> tokens = random_tokens(rng_, 100);
  CacheOptions o;
  o.input_tokens = tokens;
  o.beam_width = 2;  // refused: a fixed PRIVATE pool
  ASSERT_FALSE(m->create_kv_cache(std::move(o)).is_ok());
  EXPECT_EQ(o.input_tokens, tokens);  // NOLINT(bugprone-use-after-move): refused, kept
  o.beam_width = 1;
  Result<std::unique_ptr<KvCache>> c = m->create_kv_cache(std::move(o));
  ASSERT_OK(c.status());
  KvCache& cache = **c;
  ASSERT_OK(cache.resume({}));
  ASSERT_OK(cache.resize(64, 64));
  std::vector<int32_t> wrong(tokens.begin(), tokens.begin() + 64);
  wrong[5] += 1;
  EXPECT_NE(cache.commit(wrong).message().find("commit token 5 is " + std::to_string(wrong[5]) +
                                               " but the request has " + std::to_string(tokens[5])),
            std::string::npos);
  ASSERT_OK(cache.commit(std::span<const int32_t>(tokens).first(64)));
  EXPECT_EQ(cache.committed_tokens(), 64u);
}

TEST_F(Lifecycle, MaxLiveKvCachesBoundsActivePlusSuspended) {
  LifecycleModel model;
  model.max_live = 3;
  auto m = make_manager(model);
  EXPECT_TRUE(m->plan().pool_groups()[1].fixed_private);
  EXPECT_EQ(m->plan().slots(TierKind::kGpu, PoolGroupId(1)), 4u);  // ceil(3 / 0.97)
  std::vector<Request> live;
  for (int i = 0; i < 3; ++i) live.push_back(make_request(*m, random_tokens(rng_, 5), 5));
  ASSERT_OK(live[0].cache->resume({}));
  Result<std::unique_ptr<KvCache>> fourth = m->create_kv_cache({});
  ASSERT_FALSE(fourth.is_ok());
  EXPECT_EQ(fourth.status().code(), StatusCode::kRefused);
  ASSERT_OK(live[1].cache->close());
  EXPECT_TRUE(m->create_kv_cache({}).is_ok());  // closing made room (the new one is destroyed)
}

TEST_F(Lifecycle, MisuseGetsAClearErrorAndChangesNothing) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 100), 50);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 50));
  ASSERT_OK(a.cache->resize(60, 50));
  const std::string before = testing::debug_snapshot(*m);
  struct Case {
    const char* what;
    std::function<Status()> call;
    StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"unknown group", [&] { return a.cache->block_table(CacheGroupId(9)).status(); },
       StatusCode::kNotFound, "unknown cache group 9"},
      {"ssm table", [&] { return a.cache->block_table(kSsm).status(); },
       StatusCode::kInvalidArgument, "is an SSM group"},
      {"history above capacity", [&] { return a.cache->resize(60, 61); },
       StatusCode::kInvalidArgument, "history 61 must be <= capacity 60"},
      {"shrinking history", [&] { return a.cache->resize(60, 40); }, StatusCode::kInvalidArgument,
       "history 40 is below the current history 50"},
      {"resume of an active cache", [&] { return a.cache->resume({}); },
       StatusCode::kFailedPrecondition, "resume needs state SUSPENDED, it is ACTIVE"},
      {"small index buffer",
       [&] {
         std::vector<int32_t> small(2);
         return a.cache->set_index_buffer(kFull, 0, small);
       },
       StatusCode::kInvalidArgument, "index buffer of 2 entries"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Status s = c.call();
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s.message();
    EXPECT_EQ(testing::debug_snapshot(*m), before);
  }
  ASSERT_OK(a.cache->close());
  const std::string closed = testing::debug_snapshot(*m);
  EXPECT_TRUE(a.cache->close().is_ok());  // close is idempotent (DESIGN §5): OK, no change
  EXPECT_EQ(a.cache->resume({}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.cache->resize(10, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(testing::debug_snapshot(*m), closed);
}

TEST_F(Lifecycle, IndexBuffersFollowLockAndUnlock) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  std::vector<int32_t> full(16, 7), state(1, 7);  // outlive the cache that writes them
  Request a = make_request(*m, random_tokens(rng_, 100), 50);
  ASSERT_OK(a.cache->set_index_buffer(kFull, 0, full));
  ASSERT_OK(a.cache->set_index_buffer(kSsm, 0, state));
  EXPECT_EQ(full[0], kBadPageIndex);  // suspended: nothing resident
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 50));
  const auto table = table_of(*a.cache, kFull);
  for (size_t b = 0; b < table.size(); ++b) EXPECT_EQ(full[b], table[b]);
  EXPECT_EQ(full[table.size()], kBadPageIndex);
  EXPECT_EQ(state[0], *a.cache->state_index(kSsm));
  ASSERT_OK(a.cache->suspend());
  EXPECT_EQ(full[0], kBadPageIndex);
  EXPECT_EQ(state[0], kBadPageIndex);
  ASSERT_OK(a.cache->resume({}));
  EXPECT_EQ(full[0], table_of(*a.cache, kFull)[0]);
  const Status refused = a.cache->resize(17 * 16, 50);  // the buffer holds 16 blocks
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("holds 16 entries; capacity 272 needs 17"), std::string::npos)
      << refused.message();
  ASSERT_OK(a.cache->resize(16 * 16, 50));  // exactly the buffer's 16 blocks
  EXPECT_EQ(full[15], table_of(*a.cache, kFull)[15]);
  ASSERT_OK(a.cache->set_index_buffer(kFull, 0, {}));  // no buffer: no bound
  ASSERT_OK(a.cache->resize(17 * 16, 50));
  std::vector<int32_t> short_buffer(10);  // shorter than the capacity: refused, nothing set
  EXPECT_EQ(a.cache->set_index_buffer(kFull, 0, short_buffer).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(a.cache->resize(18 * 16, 50));
}

// Tiers of the pages of one cache's group, by block, read off the debug snapshot.
std::vector<std::string> block_tiers(const std::string& snapshot, int cache, int group) {
  std::map<int64_t, std::string> tier_of;
  std::istringstream in(snapshot);
  std::string line;
  std::vector<std::string> out;
  int current = -1, group_line = 0;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string w;
    words >> w;
    if (w == "page") {
      int64_t id;
      std::string g, where;
      words >> id >> g >> where;
      tier_of[id] = where.substr(0, where.find(':'));
    } else if (w == "cache") {
      words >> current;
      group_line = 0;
    } else if (w == "pages" && current == cache && group_line++ == group) {
      int64_t id;
      while (words >> id) out.push_back(id < 0 ? "-" : tier_of[id]);
    }
  }
  return out;
}

TEST_F(Lifecycle, LowPriorityBlocksAreEvictedFirst) {
  auto m = make_manager(LifecycleModel{});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 200), 160);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 160));
  ASSERT_OK(a.cache->set_block_priority(5, 8, 1));
  ASSERT_OK(a.cache->suspend());
  // Another request needs all free attention slots and six more: six of A's pages go to the
  // host, and they are the low-priority ones (blocks 5..7 of the full and the window group; the
  // window's 5 and 6 left the window and wait, HELD, for a commit), not the least recently used.
  Request b = make_request(*m, random_tokens(rng_, 5000), 5000);
  ASSERT_OK(b.cache->resume({}));
  const uint64_t free_now = m->storage_stats().tiers[0].pool_groups[2].free_slots;
  ASSERT_EQ((free_now + 6) % 2, 0u);  // full and window blocks come in pairs at history 0
  ASSERT_OK(b.cache->resize((free_now + 6) / 2 * 16, 0));
  const std::string snap = testing::debug_snapshot(*m);
  size_t on_host = 0;
  for (size_t at = snap.find(" HOST"); at != std::string::npos; at = snap.find(" HOST", at + 1))
    ++on_host;
  EXPECT_EQ(on_host, 6u) << snap;
  const std::vector<std::string> tiers = block_tiers(snap, 0, 2);
  ASSERT_EQ(tiers.size(), 10u);
  for (size_t block = 0; block < tiers.size(); ++block) {
    EXPECT_EQ(tiers[block], block >= 5 && block < 8 ? "HOST" : "GPU") << "block " << block;
  }
  ASSERT_OK(b.cache->close());
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(engine.verify(*a.cache, a.fake));
}

TEST_F(Lifecycle, ShutdownIsRefusedWhileCachesAreOpen) {
  auto m = make_manager(LifecycleModel{});
  Request a = make_request(*m, random_tokens(rng_, 5), 5);
  EXPECT_EQ(m->shutdown().code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(a.cache->close());
  EXPECT_TRUE(m->shutdown().is_ok());
  EXPECT_FALSE(m->create_kv_cache({}).is_ok());
}

TEST_F(Lifecycle, NothingReadsAPageBeforeItsCopyCompletes) {
  auto env = std::make_shared<testing::FaultInjectionEnv>();
  auto m = make_manager(LifecycleModel{}, BackendOptions{.env = env});
  testing::FakeEngine engine(*m);
  Request a = make_request(*m, random_tokens(rng_, 700), 600);
  ASSERT_OK(a.cache->resume({}));
  ASSERT_OK(advance(engine, a, 600));
  ASSERT_OK(a.cache->suspend());
  std::vector<Request> others;
  for (int i = 0; i < 5; ++i) {
    others.push_back(make_request(*m, random_tokens(rng_, 700), 600));
    ASSERT_OK(others.back().cache->resume({}));
    ASSERT_OK(advance(engine, others.back(), 600));
    ASSERT_OK(others.back().cache->suspend());
  }
  // Hold every copy: A's pages come back from the host only when the gate opens.
  env->set_copy_gate(false);
  ASSERT_OK(a.cache->resume({}));
  EXPECT_GT(m->take_iteration_stats().pages_onboarded, 0u);
  const CopyEvent ready = a.cache->ready_event();
  EXPECT_GT(ready.ticket, 0u);
  // Reading now, without waiting, finds the wrong bytes: the copy has not run.
  testing::FakeEngine eager(*m);
  const auto table = table_of(*a.cache, kFull);
  const std::byte* first = m->slot_address(TierKind::kGpu, PoolGroupId(2), 0, table[0]);
  std::vector<std::byte> seen(first, first + 64);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    env->set_copy_gate(true);
  });
  // verify() waits for the ready event, so it sees the copied bytes.
  ASSERT_OK(engine.verify(*a.cache, a.fake));
  opener.join();
  const std::vector<std::byte> now(first, first + 64);
  EXPECT_NE(seen, now) << "the slot changed when the held copy ran";
}

// A cache may outlive its manager: it shares the manager's state, which stays until the last
// cache is gone, and every call on it keeps working.
TEST_F(Lifecycle, CacheOutlivesItsManagerSafely) {
  auto m = make_manager(LifecycleModel{});
  std::unique_ptr<KvCache> cache;
  {
    testing::FakeEngine engine(*m);
    Request a = make_request(*m, random_tokens(rng_, 200), 100);
    ASSERT_OK(a.cache->resume({}));
    ASSERT_OK(advance(engine, a, 100));
    cache = std::move(a.cache);
  }
  m.reset();
  EXPECT_EQ(cache->state(), CacheState::kActive);
  ASSERT_OK(cache->suspend());
  ASSERT_OK(cache->resume({}));
  ASSERT_OK(cache->resize(120, 110));
  EXPECT_TRUE(cache->block_table(kFull).is_ok());
  ASSERT_OK(cache->close());
  cache.reset();  // frees the pools
}

// Three threads drive 30 requests each (resume, compute, suspend, resume, verify, close) while a
// fourth checks invariants. A resume refused for room is retried a bounded number of times
// (other threads free memory as they close); every request must complete its whole cycle.
TEST_F(Lifecycle, ConcurrentRequestsOnThreadsAllComplete) {
  auto m = make_manager(LifecycleModel{});
  constexpr int kThreads = 3, kRequests = 30, kMaxTries = 200000;
  std::atomic<bool> failed{false};
  std::atomic<int> completed{0};
  std::vector<std::thread> threads;
  auto resume = [&](KvCache& cache) {
    for (int tries = 0; tries < kMaxTries; ++tries) {
      if (cache.resume({}).is_ok()) return true;
      std::this_thread::yield();
    }
    return false;  // waited too long: the test fails below
  };
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      testing::FakeEngine engine(*m);
      for (int i = 0; i < kRequests && !failed; ++i) {
        Request r = make_request(*m, random_tokens(rng, 200), 100);
        bool ok = resume(*r.cache);
        for (uint64_t n = 20; ok && n <= 200; n += 20) {
          ok = advance(engine, r, n).is_ok();
          if (ok && n == 100) {
            ok = r.cache->suspend().is_ok() && resume(*r.cache) &&
                 engine.verify(*r.cache, r.fake).is_ok();
          }
        }
        ok = ok && r.cache->close().is_ok();
        if (ok)
          ++completed;
        else
          failed = true;
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 200; ++i) {
      if (!testing::check_invariants(*m).empty()) failed = true;
      (void)m->storage_stats();
    }
  });
  for (std::thread& t : threads) t.join();
  EXPECT_FALSE(failed);
  EXPECT_EQ(completed.load(), kThreads * kRequests);
  expect_clean(*m);
}

}  // namespace
}  // namespace hybridkv
