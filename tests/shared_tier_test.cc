// The shared tier through the managers (issue 33 items 2-6): managers on one real redis-server
// (started on a loopback port) publish committed blocks and snapshots, and another manager (in
// this process or another one) fetches them; the fake engine checks every fetched page byte for
// byte. The hybrid rule (KV without its state is a miss), a block missing from the middle of a
// chain, a corrupted object and a dead store each leave the hit where they must and serve no
// wrong byte.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "redis_server.h"
#include "shared_fixture.h"

namespace hybridkv {
namespace {

using testing::LifecycleModel;
using testing::make_request;
using testing::RedisServer;
using testing::Request;

// The fleet test's requests: the second instance first finds something of the first's at 60
// (at 30 it finds nothing), so the sanitized builds, ~10x slower, leave the test to release.
constexpr int kFleetLimit = 60;
constexpr uint32_t kTpb = testing::kSharedTpb;
constexpr CacheGroupId kSsm = testing::kSharedSsm, kFull = testing::kSharedFull;

class SharedTierTest : public testing::SharedFixture {
 protected:
  void SetUp() override {
    server_ = RedisServer::start();
    if (!server_) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
    store_ = std::shared_ptr<SharedStore>(open_redis_store(server_->config()).value().release());
  }

  std::unique_ptr<RedisServer> server_;
};

TEST_F(SharedTierTest, AnotherInstanceFetchesAPrefixByteExact) {
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager();
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  const SharedTierStats published = a->shared_stats();
  EXPECT_GE(published.objects_published, 12u + 2u);  // 12 full-attention blocks, 2 snapshots
  EXPECT_EQ(published.publish_failures, 0u);

  auto b = manager();  // a second instance: nothing local
  SharedFetch f;
  EXPECT_EQ(fetch_and_verify(*b, tokens, &f), 192u);
  EXPECT_EQ(f.local_tokens, 0u);
  EXPECT_EQ(f.hit_tokens, 192u);
  EXPECT_GT(f.objects_fetched, 12u);
  EXPECT_EQ(f.objects_corrupt, 0u);
  // Fetching again finds everything local: nothing moves.
  const Result<SharedFetch> again = b->fetch_shared({}, std::span(tokens).first(250));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->local_tokens, 192u);
  EXPECT_EQ(again->objects_fetched, 0u);
}

// KV without its state is a miss: with the snapshots gone, the complete KV chain is no hit;
// with only the last one gone, the hit ends at the earlier one.
TEST_F(SharedTierTest, KvWithoutASnapshotAtItsEndIsAMiss) {
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager();
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  const std::vector<std::string> last = {key(tokens, 11, kSsm)};
  ASSERT_EQ(store_->remove(last).front(), StoreOutcome::kOk);
  auto b = manager();
  EXPECT_EQ(fetch_and_verify(*b, tokens), 96u);

  const std::vector<std::string> first = {key(tokens, 5, kSsm)};
  ASSERT_EQ(store_->remove(first).front(), StoreOutcome::kOk);
  auto c = manager();
  SharedFetch f;
  EXPECT_EQ(fetch_and_verify(*c, tokens, &f), 0u);
  EXPECT_EQ(f.objects_fetched, 0u);  // nothing is fetched for a miss
}

// A block evicted from the middle of a chain: the hit stops before it (at the last snapshot
// before the gap).
TEST_F(SharedTierTest, ABlockMissingFromTheMiddleOfAChainStopsTheHitBeforeIt) {
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager();
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  const std::vector<std::string> gap = {key(tokens, 8, kFull)};
  ASSERT_EQ(store_->remove(gap).front(), StoreOutcome::kOk);
  auto b = manager();
  EXPECT_EQ(fetch_and_verify(*b, tokens), 96u);
}

// Fault: a corrupted object (one payload byte changed in the store) fails its checksum: it is
// counted, deleted, and the hit stops before its block; no wrong byte is served.
TEST_F(SharedTierTest, ACorruptedObjectIsCountedDeletedAndAMiss) {
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager();
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  const std::string bad = key(tokens, 9, kFull);
  const std::string cmd =
      "redis-cli -p " + std::to_string(server_->port()) + " setrange " + bad + " 100 X > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto b = manager();
  SharedFetch f;
  EXPECT_EQ(fetch_and_verify(*b, tokens, &f), 96u);
  EXPECT_EQ(f.objects_corrupt, 1u);
  EXPECT_EQ(b->shared_stats().objects_corrupt, 1u);
  EXPECT_EQ(store_->exists(std::vector<std::string>{bad}).front(), StoreOutcome::kMissing);
}

// Fault: the store is killed. Commits publish without waiting (failures counted), a fetch is a
// miss within the timeout, and the request computes from scratch; after a restart (empty: no
// persistence) publishing works again.
TEST_F(SharedTierTest, ADeadStoreCostsMissesNeverAStall) {
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager();
  server_->kill();
  const auto t = std::chrono::steady_clock::now();
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  auto b = manager();
  SharedFetch f;
  EXPECT_EQ(fetch_and_verify(*b, tokens, &f), 0u);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(), 5.0);
  EXPECT_GT(a->shared_stats().publish_failures, 0u);
  EXPECT_GT(f.store_failures, 0u);
  ASSERT_TRUE(server_->restart());
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the reconnect backoff
  auto c = manager();
  ASSERT_OK(serve(*c, tokens, {96, 192}));
  EXPECT_GT(c->shared_stats().objects_published, 0u);
}

// Several processes: two writer processes (each its own manager, its own prompt, one prefix in
// common) publish on one Redis; this process reads both byte-exact. The shared prefix is
// written once (the second writer finds it present).
TEST_F(SharedTierTest, PagesWrittenByOtherProcessesAreReadByteExact) {
  const std::vector<int32_t> common = testing::random_tokens(rng_, 96);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 2; ++p) {
    std::vector<int32_t> t = common;
    const std::vector<int32_t> rest = testing::random_tokens(rng_, 204);
    t.insert(t.end(), rest.begin(), rest.end());
    prompts.push_back(t);
  }
  for (int p = 0; p < 2; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the writer: its own store connection and manager
      ManagerConfig c = config();
      c.shared.store =
          std::shared_ptr<SharedStore>(open_redis_store(server_->config()).value().release());
      auto m = std::move(KvCacheManager::create(c, {BackendKind::kHost})).value();
      const bool ok =
          serve(*m, prompts[p], {96, 192}).is_ok() && m->shared_stats().publish_failures == 0;
      std::_Exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer " << p;
  }
  auto reader = manager();
  for (int p = 0; p < 2; ++p) EXPECT_EQ(fetch_and_verify(*reader, prompts[p]), 192u) << p;
}

// A fetch is a prefetch an engine may run on a worker thread: its store round trips hold no
// manager lock, so requests keep running while it waits, and what it brings in checks.
TEST_F(SharedTierTest, AFetchOnAWorkerThreadRunsBesideServing) {
  std::vector<std::vector<int32_t>> prompts;
  auto a = manager();
  for (int p = 0; p < 4; ++p) {
    prompts.push_back(testing::random_tokens(rng_, 300));
    ASSERT_OK(serve(*a, prompts.back(), {96, 192}));
  }
  auto b = manager();
  std::vector<uint64_t> hits(prompts.size(), 0);
  std::thread worker([&] {
    for (size_t p = 0; p < prompts.size(); ++p) {
      const Result<SharedFetch> f = b->fetch_shared({}, std::span(prompts[p]).first(250));
      hits[p] = f.is_ok() ? f->hit_tokens : 0;
    }
  });
  // Meanwhile this thread serves requests of its own on the same manager.
  for (int r = 0; r < 4; ++r) ASSERT_OK(serve(*b, testing::random_tokens(rng_, 300), {96, 192}));
  worker.join();
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_EQ(hits[p], 192u) << p;
    EXPECT_EQ(fetch_and_verify(*b, prompts[p]), 192u) << p;
  }
}

// A fetch slower than recomputing is skipped (the engine's prefill rate against the store's).
TEST_F(SharedTierTest, AFetchSlowerThanRecomputingIsSkipped) {
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager();
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  ManagerConfig fast = config();
  fast.shared.prefill_tokens_per_s = 1e12;  // recomputing 192 tokens takes no time
  auto b = std::move(KvCacheManager::create(fast, {BackendKind::kHost})).value();
  SharedFetch f;
  EXPECT_EQ(fetch_and_verify(*b, tokens, &f), 0u);
  EXPECT_TRUE(f.skipped);
  EXPECT_EQ(f.objects_fetched, 0u);
  EXPECT_EQ(b->shared_stats().fetches_skipped, 1u);
  ManagerConfig slow = config();
  slow.shared.prefill_tokens_per_s = 1000;  // 192 ms of prefill: fetching wins
  auto c = std::move(KvCacheManager::create(slow, {BackendKind::kHost})).value();
  EXPECT_EQ(fetch_and_verify(*c, tokens), 192u);
}

// A fleet of two `hybridkv sim` processes (real bytes, the fake engine checking every page) on
// one Redis: the second instance fetches pages the first published, and every page checks.
TEST_F(SharedTierTest, ASimFleetOnOneRedisFetchesEachOthersPagesAndVerifies) {
#ifdef HKV_SANITIZED
  GTEST_SKIP() << "two verified sims of 60 requests: run in the release build";
#endif
  // A store of its own: with the fixture's 512 MiB limit the second instance found nothing.
  auto big = RedisServer::start({"--maxmemory", "4gb"});
  ASSERT_TRUE(big);
  const std::string base =
      std::string(HKV_CLI) + " sim --model " + HKV_MODELS_DIR + "/nemotron_h_8b.json --trace " +
      HKV_DATA_DIR + "/mooncake_conversation_first1000.jsonl --limit " +
      std::to_string(kFleetLimit) +
      " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB --max-batch 16"
      " --snapshot-policy branch,demand,periodic:2048 --verify --quiet --shared-redis 127.0.0.1:" +
      std::to_string(big->port());
  const std::string dir = testing::make_temp_dir();
  for (int k = 0; k < 2; ++k) {
    const std::string json = dir + "/i" + std::to_string(k) + ".json";
    const std::string cmd =
        base + " --instance " + std::to_string(k) + "/2 --json " + json + " > " + dir + "/out 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(json);
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u) << "instance " << k;
    EXPECT_GT(j["shared"]["objects_published"].get<uint64_t>(), 0u) << "instance " << k;
    if (k == 1) {
      EXPECT_GT(j["shared"]["hit_tokens"].get<uint64_t>(), 0u);  // from instance 0
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(SharedTierConfig, SimFlagsAreCheckedAndNamed) {
  const std::string base = std::string(HKV_CLI) + " sim --model " + HKV_MODELS_DIR +
                           "/nemotron_h_8b.json --trace synthetic:4 --quiet ";
  const std::string out = testing::make_temp_dir() + "/err";
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--instance 2/2", "--instance: '2/2' is not K/N"},
           {"--instance x", "--instance: 'x' is not K/N"},
           {"--backend host --shared-redis nocolon", "--shared-redis: 'nocolon' is not host:port"},
           {"--shared-redis 127.0.0.1:6379", "--shared-redis: the none backend has no bytes"}}) {
    const int status = std::system((base + flags + " > " + out + " 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(status), 2) << flags;
    std::ifstream in(out);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(message), std::string::npos) << flags << ": " << text;
  }
}

TEST(SharedTierConfig, AStoreWithoutAModelIdOrWithNoQueueIsRefusedByName) {
  ManagerConfig c = testing::lifecycle_config(LifecycleModel{});
  RedisStoreConfig rc;
  rc.port = 1;
  c.shared.store = std::shared_ptr<SharedStore>(open_redis_store(rc).value().release());
  const Result<std::unique_ptr<KvCacheManager>> m = KvCacheManager::create(c, {BackendKind::kHost});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("shared.model_id"), std::string::npos);
  c.shared.model_id = "m";
  c.shared.fetch_bytes_per_s = 0;
  const Result<std::unique_ptr<KvCacheManager>> rate =
      KvCacheManager::create(c, {BackendKind::kHost});
  ASSERT_FALSE(rate.is_ok());
  EXPECT_NE(rate.status().message().find("shared.fetch_bytes_per_s 0"), std::string::npos);
  c.shared.fetch_bytes_per_s = 1e9;
  c.shared.max_queued_bytes = 0;
  c.shared.max_queued_objects = 0;
  const Result<std::unique_ptr<KvCacheManager>> queue =
      KvCacheManager::create(c, {BackendKind::kHost});
  ASSERT_FALSE(queue.is_ok());
  EXPECT_NE(queue.status().message().find("shared.max_queued_bytes 0"), std::string::npos);
  EXPECT_NE(queue.status().message().find("shared.max_queued_objects 0"), std::string::npos);
  ManagerConfig none = testing::lifecycle_config(LifecycleModel{});
  auto plain = std::move(KvCacheManager::create(none, {BackendKind::kHost})).value();
  EXPECT_EQ(plain->fetch_shared({}, std::vector<int32_t>(40, 1)).status().code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace hybridkv
