// The shared tier on a store in this process's memory (testing::MemoryStore): no server, so
// these run everywhere, and on the GPU as shared_memory_test_cuda (the CUDA backend's publishing
// copies into pinned buffers and its fetch writes, byte-exact). The store itself (write once,
// least-recently-used eviction within its byte limit), the ordering of a publishing copy before
// the slot's next owner, the bounded queue, and the none backend's modelled tier.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "hybridkv/testing/fault_env.h"
#include "hybridkv/testing/memory_store.h"
#include "shared_fixture.h"
#include "test_backend.h"

namespace hybridkv {
namespace {

using testing::make_request;
using testing::MemoryStore;
using testing::Request;

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

TEST(MemoryStore, WritesOnceAndEvictsTheLeastRecentlyUsedWithinItsLimit) {
  MemoryStore store(30);
  const std::vector<std::string> keys = {"a", "b", "c"};
  const std::vector<std::byte> ten = bytes_of("0123456789");
  const std::vector<std::span<const std::byte>> values(3, ten);
  EXPECT_EQ(store.put(keys, values), std::vector<StoreOutcome>(3, StoreOutcome::kOk));
  EXPECT_EQ(store.put(std::span(keys).first(1), std::span(values).first(1)).front(),
            StoreOutcome::kExists);
  std::vector<std::byte> buffer(10);
  std::vector<std::span<std::byte>> spans = {buffer};
  std::vector<uint64_t> sizes(1);
  ASSERT_EQ(store.get(std::span(keys).first(1), spans, sizes).front(), StoreOutcome::kOk);  // a
  EXPECT_EQ(buffer, ten);
  const std::vector<std::string> d = {"d"};
  EXPECT_EQ(store.put(d, std::span(values).first(1)).front(), StoreOutcome::kOk);
  // b was the least recently used: evicted; a (read) and c stay.
  EXPECT_EQ(store.exists(keys), (std::vector<StoreOutcome>{
                                    StoreOutcome::kOk, StoreOutcome::kMissing, StoreOutcome::kOk}));
  EXPECT_EQ(store.evictions(), 1u);
  EXPECT_EQ(store.bytes(), 30u);
  std::vector<std::byte> small(4);
  std::vector<std::span<std::byte>> small_spans = {small};
  EXPECT_EQ(store.get(std::span(keys).first(1), small_spans, sizes).front(),
            StoreOutcome::kTooLarge);
  EXPECT_EQ(sizes[0], 10u);
  const std::vector<std::byte> big(31);
  const std::vector<std::span<const std::byte>> too_big = {big};
  EXPECT_EQ(store.put(std::vector<std::string>{"e"}, too_big).front(), StoreOutcome::kFailed);
  EXPECT_EQ(store.remove(keys), (std::vector<StoreOutcome>{
                                    StoreOutcome::kOk, StoreOutcome::kMissing, StoreOutcome::kOk}));
  EXPECT_EQ(store.objects(), 1u);
}

TEST(MemoryStore, ChargesWhatItsChargeFunctionSays) {
  MemoryStore store(1000, [](std::string_view, uint64_t) { return uint64_t{400}; });
  const std::vector<std::byte> one(1);
  const std::vector<std::span<const std::byte>> values(3, one);
  (void)store.put(std::vector<std::string>{"a", "b", "c"}, values);
  EXPECT_EQ(store.objects(), 2u);
  EXPECT_EQ(store.bytes(), 800u);
}

class SharedMemoryTest : public testing::SharedFixture {
 protected:
  void SetUp() override { store_ = std::make_shared<MemoryStore>(); }
};

TEST_F(SharedMemoryTest, AnotherInstanceFetchesAPrefixByteExact) {
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager(testing::test_backend());
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  EXPECT_GE(a->shared_stats().objects_published, 12u + 2u);  // 12 full blocks, 2 snapshots
  auto b = manager(testing::test_backend());
  SharedFetch f;
  EXPECT_EQ(fetch_and_verify(*b, tokens, &f), 192u);
  EXPECT_EQ(f.objects_corrupt, 0u);
  EXPECT_GT(f.objects_fetched, 12u);
}

// A commit only queues its pages' copies (the step never reads them): the request's pages may
// lose their slots to another request before the copies run. The new owner writes those slots
// only after the copies, so what is published is what was committed: another instance reads it
// byte-exact. The publishing copies are held (FaultInjectionEnv) behind the commit's own
// snapshot copies until the other request has its pages; with no HOST tier a page that loses its
// slot is dropped, so no copy down orders the reuse instead.
TEST_F(SharedMemoryTest, APublishedPageIsCopiedBeforeItsSlotIsReused) {
  if (testing::test_backend().kind != BackendKind::kHost) GTEST_SKIP() << "holds host copies";
  auto env = std::make_shared<testing::FaultInjectionEnv>();
  ManagerConfig c = config();
  c.tiers.resize(1);
  auto a = std::move(KvCacheManager::create(c, {BackendKind::kHost, 0, env})).value();
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  testing::FakeEngine engine(*a);
  Request r = make_request(*a, tokens, 192);
  ASSERT_OK(r.cache->resume({}));
  ASSERT_OK(testing::advance(engine, r, 192));
  env->set_copy_gate(false);
  ASSERT_OK(testing::commit_computed(r));  // a batch of snapshot copies, then the publishing one
  env->let_copies_through(1);
  while (env->batches_run() < 1) std::this_thread::yield();
  ASSERT_OK(r.cache->close());
  EXPECT_EQ(a->shared_stats().objects_published, 0u);  // nothing written: the copies wait
  // Another request takes the whole GPU: every page of the committed prefix loses its slot.
  Request other = make_request(*a, testing::random_tokens(rng_, 4000), 1);
  ASSERT_OK(other.cache->resume({}));
  uint64_t upto = 16;
  while (other.cache->resize(upto + 16, 0).is_ok()) upto += 16;
  EXPECT_GT(a->take_iteration_stats().pages_dropped, 12u);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    env->set_copy_gate(true);
  });
  ASSERT_OK(engine.step(*other.cache, other.fake, upto));  // writes after the copies
  opener.join();
  a->flush_shared();
  EXPECT_GE(a->shared_stats().objects_published, 12u + 1u);
  auto b = manager();
  EXPECT_EQ(fetch_and_verify(*b, tokens), 192u);
}

// The queue is bounded in objects and in bytes: what does not fit is dropped and counted, and
// the commit goes on (the copies are held, so nothing leaves the queue meanwhile).
TEST_F(SharedMemoryTest, AFullQueueDropsObjectsAndCountsThem) {
  if (testing::test_backend().kind != BackendKind::kHost) GTEST_SKIP() << "holds host copies";
  for (const bool by_bytes : {false, true}) {
    auto env = std::make_shared<testing::FaultInjectionEnv>();
    ManagerConfig c = config();
    if (by_bytes)
      c.shared.max_queued_bytes = 1;  // no object fits
    else
      c.shared.max_queued_objects = 4;
    auto a = std::move(KvCacheManager::create(c, {BackendKind::kHost, 0, env})).value();
    testing::FakeEngine engine(*a);
    Request r = make_request(*a, testing::random_tokens(rng_, 300), 192);
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(testing::advance(engine, r, 192));
    env->set_copy_gate(false);
    // 16 objects to send: 12 full-attention blocks, the window's 3 and a snapshot.
    ASSERT_OK(testing::commit_computed(r));
    EXPECT_EQ(a->shared_stats().objects_dropped, by_bytes ? 16u : 12u) << by_bytes;
    env->set_copy_gate(true);
    a->flush_shared();
    EXPECT_EQ(a->shared_stats().objects_published, by_bytes ? 0u : 4u) << by_bytes;
    ASSERT_OK(r.cache->close());
  }
}

// A store whose lookups wait while it is shut (a slow store).
class GatedStore : public MemoryStore {
 public:
  std::vector<StoreOutcome> exists(std::span<const std::string> keys) override {
    {
      std::unique_lock lock(mu_);
      ++waiting_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
      --waiting_;
    }
    return MemoryStore::exists(keys);
  }
  void set_open(bool open) {
    std::lock_guard lock(mu_);
    open_ = open;
    cv_.notify_all();
  }
  void wait_for_a_lookup() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return waiting_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int waiting_ = 0;
};

// fetch_shared_async: the fetch waits on the store on the tier's thread while the manager goes
// on serving; once its future is ready the request finds the fetched prefix, byte-exact.
TEST_F(SharedMemoryTest, AnAsyncFetchRunsBesideServingAndIsInWhenItsFutureIsReady) {
  auto store = std::make_shared<GatedStore>();
  store_ = store;
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager(testing::test_backend());
  ASSERT_OK(serve(*a, tokens, {96, 192}));
  auto b = manager(testing::test_backend());
  store->set_open(false);
  std::future<Result<SharedFetch>> fetch = b->fetch_shared_async({}, std::span(tokens).first(250));
  store->wait_for_a_lookup();
  ASSERT_OK(serve(*b, testing::random_tokens(rng_, 300), {96, 192}));  // serving goes on
  EXPECT_EQ(fetch.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  store->set_open(true);
  const Result<SharedFetch> f = fetch.get();
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->hit_tokens, 192u);
  EXPECT_GT(f->objects_fetched, 0u);
  EXPECT_EQ(fetch_and_verify(*b, tokens), 192u);  // now local: the request reuses it
}

// A manager that goes with fetches queued answers those not started; the one under way ends.
TEST_F(SharedMemoryTest, FetchesQueuedWhenTheManagerGoesAreAnswered) {
  auto store = std::make_shared<GatedStore>();
  store_ = store;
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto b = manager();
  store->set_open(false);
  std::future<Result<SharedFetch>> first = b->fetch_shared_async({}, tokens);
  store->wait_for_a_lookup();  // the first is under way
  std::future<Result<SharedFetch>> second = b->fetch_shared_async({}, tokens);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store->set_open(true);
  });
  b.reset();
  opener.join();
  EXPECT_TRUE(first.get().is_ok());
  const Result<SharedFetch> late = second.get();
  ASSERT_FALSE(late.is_ok());
  EXPECT_NE(late.status().message().find("destroyed before the fetch ran"), std::string::npos);
  auto plain =
      std::move(KvCacheManager::create(testing::lifecycle_config({}), {BackendKind::kHost}))
          .value();
  EXPECT_EQ(plain->fetch_shared_async({}, tokens).get().status().code(),
            StatusCode::kFailedPrecondition);
}

// The none backend has no bytes: its objects carry none, each charged its page's bytes by the
// simulator's store, and another instance's fetch brings the pages into its tree all the same
// (the hybrid rule holds). They are keyed apart from real objects.
TEST_F(SharedMemoryTest, TheNoneBackendModelsTheTier) {
  uint64_t charged = 0;
  auto store = std::make_shared<MemoryStore>(UINT64_MAX, [&](std::string_view, uint64_t size) {
    charged += size;
    return size;
  });
  store_ = store;
  const std::vector<int32_t> tokens = testing::random_tokens(rng_, 300);
  auto a = manager({BackendKind::kNone});
  {
    CacheOptions o;
    o.input_tokens.assign(tokens.begin(), tokens.begin() + 192);
    std::unique_ptr<KvCache> c = std::move(a->create_kv_cache(o)).value();
    ASSERT_OK(c->resume({}));
    ASSERT_OK(c->resize(192, 192));
    ASSERT_OK(c->commit(std::span(tokens).first(192)));
    ASSERT_OK(c->close());
  }
  a->flush_shared();
  EXPECT_EQ(a->shared_stats().objects_published, 16u);
  EXPECT_EQ(charged, 16 * (kSharedObjectHeaderBytes + kSharedObjectTrailerBytes));
  EXPECT_EQ(store->exists(std::vector<std::string>{key(tokens, 11, testing::kSharedSsm, true),
                                                   key(tokens, 11, testing::kSharedSsm)}),
            (std::vector<StoreOutcome>{StoreOutcome::kOk, StoreOutcome::kMissing}));
  auto b = manager({BackendKind::kNone});
  const Result<SharedFetch> f = b->fetch_shared({}, std::span(tokens).first(250));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->hit_tokens, 192u);
  EXPECT_EQ(f->objects_fetched, 16u);  // what a real backend fetches: bytes counted as such
  EXPECT_GT(f->bytes_fetched, 16 * (kSharedObjectHeaderBytes + kSharedObjectTrailerBytes));
  CacheOptions o;
  o.input_tokens.assign(tokens.begin(), tokens.begin() + 250);
  std::unique_ptr<KvCache> c = std::move(b->create_kv_cache(o)).value();
  EXPECT_EQ(c->reuse_match().reused_tokens, 192u);
  EXPECT_EQ(testing::check_invariants(*b), "");
  // Without the snapshot at 192, the KV there is no hit.
  ASSERT_EQ(
      store->remove(std::vector<std::string>{key(tokens, 11, testing::kSharedSsm, true)}).front(),
      StoreOutcome::kOk);
  auto c2 = manager({BackendKind::kNone});
  EXPECT_EQ(c2->fetch_shared({}, std::span(tokens).first(250))->hit_tokens, 0u);
}

}  // namespace
}  // namespace hybridkv
