// Ranks that agree (issue 34 item 2): engines that run one process per rank (SGLang,
// TensorRT-LLM) feed each rank's manager the same calls and need the same decisions back. Two
// managers, driven by the same randomized schedule in two threads at once, their copy threads
// delayed at random and differently, must answer every call alike and hold the same block
// tables and state indices after every call; on the engine backend (its _engine twin) the copy
// lists each call hands out are compared too. Prints its seed; set HKV_SEED to replay one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "hybridkv/testing/fault_env.h"
#include "hybridkv/testing/host_engine.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::LifecycleModel;
using testing::make_request;
using testing::Request;

#ifdef HKV_SANITIZED
constexpr uint64_t kOperations = 1'500;
#else
constexpr uint64_t kOperations = 6'000;
#endif

// The copy lists a rank's engine ran since the last call (engine backend; none elsewhere).
void observe_copies(testing::HostEngine* engine, std::ostringstream& o) {
  if (engine == nullptr) return;
  (void)engine->run();  // what the call queued and nobody waited for yet
  for (const EngineCopyBatch& b : engine->take_ran()) {
    o << " | batch " << b.event.ticket;
    for (const EngineCopyList& l : b.lists) {
      o << " " << static_cast<int>(l.src_tier) << ">" << static_cast<int>(l.dst_tier) << " pg"
        << l.src_pool_group.value << ">" << l.dst_pool_group.value;
      for (size_t i = 0; i < l.src_slots.size(); ++i)
        o << ' ' << l.src_slots[i] << ':' << l.dst_slots[i];
    }
  }
}

// What a rank can see of its manager's decisions after a call: the call's answer, every live
// request's tables and state indices, the pages moved between tiers and, on the engine
// backend, the copy lists themselves.
std::string observe(KvCacheManager& m, testing::HostEngine* engine,
                    const std::vector<Request>& requests, const Status& s) {
  std::ostringstream o;
  o << status_code_name(s.code());
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    if (!r.cache || r.cache->state() != CacheState::kActive) continue;
    o << " | r" << i << " h" << r.cache->history() << " c" << r.cache->capacity();
    for (const CacheGroup& g : m.plan().cache_groups()) {
      if (g.kind == GroupKind::kSsm) {
        const Result<int32_t> slot = r.cache->state_index(g.id);
        o << " s" << (slot ? *slot : -2);
        continue;
      }
      const Result<std::span<const int32_t>> table = r.cache->block_table(g.id);
      if (!table) continue;
      o << " t";
      for (int32_t slot : *table) o << ',' << slot;
    }
  }
  const IterationStats it = m.take_iteration_stats();
  o << " | moved " << it.pages_offloaded << '/' << it.pages_onboarded << '/' << it.pages_dropped;
  observe_copies(engine, o);
  return o.str();
}

// One rank: the schedule of `seed` on its manager, one observation per call.
std::vector<std::string> drive(KvCacheManager& m, testing::HostEngine* copies, uint64_t seed) {
  std::mt19937_64 rng(seed);  // the schedule: every rank draws the same calls
  testing::FakeEngine engine(m);
  std::vector<std::vector<int32_t>> prefixes;  // shared prompt starts: reuse between requests
  for (int p = 0; p < 3; ++p) prefixes.push_back(testing::random_tokens(rng, 64 + rng() % 200));
  std::vector<Request> requests(8);
  std::vector<std::string> log;
  for (uint64_t op = 0; op < kOperations; ++op) {
    Request& r = requests[rng() % requests.size()];
    const uint64_t dice = rng() % 100;
    Status s;
    if (!r.cache) {
      std::vector<int32_t> tokens = prefixes[rng() % prefixes.size()];
      const std::vector<int32_t> rest = testing::random_tokens(rng, 1 + rng() % 400);
      tokens.insert(tokens.end(), rest.begin(), rest.end());
      r = make_request(m, tokens, 1 + rng() % tokens.size());
      s = r.cache->resume({});
      if (!s) r = Request{};
    } else if (r.cache->state() == CacheState::kSuspended) {
      s = dice < 70 ? r.cache->resume({}) : r.cache->close();
      if (dice >= 70 && s) r = Request{};
    } else if (dice < 55) {
      const uint64_t upto =
          std::min<uint64_t>(r.fake.tokens[0].size(), r.fake.computed + 1 + rng() % 64);
      s = testing::advance(engine, r, upto);
    } else if (dice < 75) {
      s = testing::commit_computed(r);
    } else if (dice < 90) {
      s = r.cache->suspend();
    } else {
      s = r.cache->close();
      if (s) r = Request{};
    }
    log.push_back(observe(m, copies, requests, s));
  }
  for (Request& r : requests) {
    if (r.cache) (void)r.cache->close();
  }
  return log;
}

TEST(Agreement, TwoRanksFedTheSameCallsDecideAlikeWhateverTheirCopiesTiming) {
  const char* env = std::getenv("HKV_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("Agreement seed %llu (HKV_SEED=%llu replays it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  LifecycleModel model;  // 2 MiB GPU, 4 MiB host: preemption, offload and onboarding
  std::vector<std::shared_ptr<testing::FaultInjectionEnv>> envs;
  std::vector<std::unique_ptr<KvCacheManager>> ranks;
  std::vector<testing::HostEngine*> engines;  // the engine twin's: copy lists compared too
  for (uint32_t rank = 0; rank < 2; ++rank) {
    envs.push_back(std::make_shared<testing::FaultInjectionEnv>());
    envs.back()->set_copy_jitter(rank == 0 ? 300 : 40, seed + rank);
    BackendOptions backend = testing::test_backend(envs.back());
    auto* engine = dynamic_cast<testing::HostEngine*>(backend.engine.get());
    if (engine != nullptr) engine->record(true);
    engines.push_back(engine);
    backend.device = static_cast<int>(rank);  // the cuda twin: a GPU per rank where there are two
    Result<std::unique_ptr<KvCacheManager>> m =
        KvCacheManager::create(testing::lifecycle_config(model), backend);
    if (!m && rank == 1) {
      backend.device = 0;  // one GPU: both ranks on it
      m = KvCacheManager::create(testing::lifecycle_config(model), backend);
    }
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ranks.push_back(std::move(m).value());
  }
  std::vector<std::string> logs[2];
  std::thread other([&] { logs[1] = drive(*ranks[1], engines[1], seed); });
  logs[0] = drive(*ranks[0], engines[0], seed);
  other.join();
  ASSERT_EQ(logs[0].size(), logs[1].size());
  uint64_t moved = 0;
  for (size_t i = 0; i < logs[0].size(); ++i) {
    ASSERT_EQ(logs[0][i], logs[1][i]) << "call " << i << " (seed " << seed << ")";
    moved += logs[0][i].find("moved 0/0/0") == std::string::npos;
  }
  EXPECT_GT(moved, kOperations / 50) << "the schedule moved almost nothing between tiers";
  if (engines[0] != nullptr) {
    const uint64_t batches = std::count_if(logs[0].begin(), logs[0].end(), [](const auto& l) {
      return l.find("| batch") != std::string::npos;
    });
    EXPECT_GT(batches, kOperations / 50) << "the copy lists were hardly compared";
  }
  for (auto& m : ranks) EXPECT_EQ(testing::check_invariants(*m), "");
}

}  // namespace
}  // namespace hybridkv
