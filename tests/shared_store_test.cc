// The shared tier's store and objects (issue 33, first part): a real redis-server on loopback,
// byte-exact round trips, write-once publishing, corrupted objects caught, and a server that is
// killed or frozen costing failures (misses), never a stall, and the store reconnecting after.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <random>
#include <thread>

#include "hybridkv/shared_object.h"
#include "hybridkv/shared_store.h"
#include "redis_server.h"

namespace hybridkv {
namespace {

using Bytes = std::vector<std::byte>;
using testing::RedisServer;

Bytes random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes out(n);
  for (std::byte& b : out) b = std::byte(rng() & 0xff);
  return out;
}

std::vector<StoreOutcome> put_all(SharedStore& s, const std::vector<std::string>& keys,
                                  const std::vector<Bytes>& values) {
  std::vector<std::span<const std::byte>> spans(values.begin(), values.end());
  return s.put(keys, spans);
}

// Gets every key into buffers of `capacity` bytes: the outcomes and the bytes read.
std::pair<std::vector<StoreOutcome>, std::vector<Bytes>> get_all(
    SharedStore& s, const std::vector<std::string>& keys, size_t capacity) {
  std::vector<Bytes> buffers(keys.size(), Bytes(capacity));
  std::vector<std::span<std::byte>> spans(buffers.begin(), buffers.end());
  std::vector<uint64_t> sizes(keys.size(), 0);
  std::vector<StoreOutcome> out = s.get(keys, spans, sizes);
  for (size_t i = 0; i < keys.size(); ++i) {
    buffers[i].resize(out[i] == StoreOutcome::kOk ? sizes[i] : 0);
  }
  return {out, buffers};
}

class SharedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = RedisServer::start();
    if (!server_) GTEST_SKIP() << "redis-server is not installed (scripts/deps.sh installs it)";
    Result<std::unique_ptr<SharedStore>> s = open_redis_store(server_->config());
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    store_ = std::move(*s);
  }

  std::unique_ptr<RedisServer> server_;
  std::unique_ptr<SharedStore> store_;
};

TEST_F(SharedStoreTest, PutGetExistsRemoveAreByteExactInOneBatch) {
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (uint64_t i = 0; i < 8; ++i) {
    keys.push_back(shared_object_key(0xfeed, 0, SharedObjectKind::kKvBlock, 1, 1000 + i));
    values.push_back(random_bytes((1 << 20) + i * 977, i));  // about 1 MiB each
  }
  for (StoreOutcome o : put_all(*store_, keys, values)) EXPECT_EQ(o, StoreOutcome::kOk);
  for (StoreOutcome o : store_->exists(keys)) EXPECT_EQ(o, StoreOutcome::kOk);
  auto [got, bytes] = get_all(*store_, keys, 2 << 20);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(got[i], StoreOutcome::kOk) << i;
    EXPECT_EQ(bytes[i], values[i]) << "object " << i << " differs";
  }
  // A buffer too small gets nothing copied.
  EXPECT_EQ(get_all(*store_, {keys[0]}, 1000).first[0], StoreOutcome::kTooLarge);
  for (StoreOutcome o : store_->remove(keys)) EXPECT_EQ(o, StoreOutcome::kOk);
  for (StoreOutcome o : store_->exists(keys)) EXPECT_EQ(o, StoreOutcome::kMissing);
  for (StoreOutcome o : get_all(*store_, keys, 2 << 20).first) EXPECT_EQ(o, StoreOutcome::kMissing);
  const StoreStats st = store_->stats();
  EXPECT_EQ(st.hits, 8u);
  EXPECT_EQ(st.failures, 0u);
}

// Two instances publish the same block at once: it is written once, and every reader gets the
// same whole object.
TEST_F(SharedStoreTest, ConcurrentPublishersOfOneObjectWriteItOnce) {
  Result<std::unique_ptr<SharedStore>> other = open_redis_store(server_->config());
  ASSERT_TRUE(other.is_ok());
  const std::vector<std::string> key = {"hkv1:test:once"};
  const std::vector<Bytes> a = {random_bytes(1 << 20, 1)}, b = {random_bytes(1 << 20, 2)};
  std::vector<StoreOutcome> ra, rb;
  std::thread t1([&] { ra = put_all(*store_, key, a); });
  std::thread t2([&] { rb = put_all(**other, key, b); });
  t1.join();
  t2.join();
  const bool a_won = ra[0] == StoreOutcome::kOk;
  EXPECT_NE(ra[0] == StoreOutcome::kOk, rb[0] == StoreOutcome::kOk) << "exactly one write";
  EXPECT_EQ(a_won ? rb[0] : ra[0], StoreOutcome::kExists);
  EXPECT_EQ(get_all(**other, key, 2 << 20).second[0], a_won ? a[0] : b[0]);
  EXPECT_EQ(get_all(*store_, key, 2 << 20).second[0], a_won ? a[0] : b[0]);
}

// Fault: a writer process killed (SIGKILL) in the middle of its puts. Every object a reader
// finds is whole and passes its checks; the rest are misses (Redis runs a SET only once all of
// it has arrived, so a cut-off command wrote nothing).
TEST_F(SharedStoreTest, AWriterKilledMidPutLeavesWholeObjectsOrMisses) {
  constexpr int kObjects = 200;
  constexpr size_t kPayload = 2 << 20;
  std::vector<std::string> keys;
  for (int i = 0; i < kObjects; ++i) keys.push_back("hkv1:killed:" + std::to_string(i));
  const SharedObjectHeader header{SharedObjectKind::kKvBlock, 7, 9};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the writer: batches of 4 objects until killed
    auto store = std::move(open_redis_store(server_->config())).value();
    for (int i = 0; i < kObjects; i += 4) {
      std::vector<Bytes> values;
      for (int k = i; k < i + 4; ++k)
        values.push_back(encode_shared_object(header, random_bytes(kPayload, k)));
      (void)put_all(*store, std::vector<std::string>(keys.begin() + i, keys.begin() + i + 4),
                    values);
    }
    std::_Exit(0);
  }
  const std::vector<std::string> first = {keys[0]};
  for (int i = 0; i < 5000 && store_->exists(first)[0] != StoreOutcome::kOk; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  const auto [out, bytes] =
      get_all(*store_, keys, kPayload + kSharedObjectHeaderBytes + kSharedObjectTrailerBytes);
  int whole = 0, missing = 0;
  for (int i = 0; i < kObjects; ++i) {
    if (out[i] == StoreOutcome::kMissing) {
      ++missing;
      continue;
    }
    ASSERT_EQ(out[i], StoreOutcome::kOk) << keys[i];
    const Result<std::span<const std::byte>> payload = open_shared_object(bytes[i], header);
    ASSERT_TRUE(payload.is_ok()) << keys[i] << ": " << payload.status().to_string();
    EXPECT_TRUE(std::equal(payload->begin(), payload->end(), random_bytes(kPayload, i).begin()));
    ++whole;
  }
  std::printf("writer killed: %d whole objects, %d misses, no partial object\n", whole, missing);
  EXPECT_GT(whole, 0);
  EXPECT_GT(missing, 0);
}

TEST(SharedObject, ARoundTripGivesThePayloadBack) {
  const Bytes payload = random_bytes(4096, 3);
  const SharedObjectHeader h{SharedObjectKind::kSnapshot, 0x1234, 0x5678};
  const Bytes object = encode_shared_object(h, payload);
  EXPECT_EQ(object.size(), payload.size() + kSharedObjectHeaderBytes + kSharedObjectTrailerBytes);
  Result<std::span<const std::byte>> open = open_shared_object(object, h);
  ASSERT_TRUE(open.is_ok()) << open.status().to_string();
  EXPECT_TRUE(std::equal(open->begin(), open->end(), payload.begin(), payload.end()));
}

// Every way an object can be wrong is refused with a message naming it (a miss, never bytes).
TEST(SharedObject, CorruptionAndMismatchesAreRefusedByName) {
  const SharedObjectHeader h{SharedObjectKind::kKvBlock, 0xabc, 0xdef};
  const Bytes good = encode_shared_object(h, random_bytes(1000, 4));
  auto refused = [&](const Bytes& object, const SharedObjectHeader& expected) {
    Result<std::span<const std::byte>> r = open_shared_object(object, expected);
    return r.is_ok() ? std::string("accepted") : r.status().message();
  };
  Bytes flipped = good;
  flipped[kSharedObjectHeaderBytes + 500] ^= std::byte{0x01};
  EXPECT_NE(refused(flipped, h).find("checksum"), std::string::npos) << refused(flipped, h);
  Bytes short_one(good.begin(), good.end() - 9);
  EXPECT_NE(refused(short_one, h).find("payload length"), std::string::npos);
  EXPECT_NE(refused(Bytes(10), h).find("shorter than"), std::string::npos);
  SharedObjectHeader other_model = h;
  other_model.fingerprint = 0xabd;
  EXPECT_NE(refused(good, other_model).find("fingerprint"), std::string::npos);
  SharedObjectHeader other_tokens = h;
  other_tokens.token_digest = 0xdee;
  EXPECT_NE(refused(good, other_tokens).find("token digest"), std::string::npos);
  SharedObjectHeader snapshot = h;
  snapshot.kind = SharedObjectKind::kSnapshot;
  EXPECT_NE(refused(good, snapshot).find("kind"), std::string::npos);
  Bytes bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  EXPECT_NE(refused(bad_magic, h).find("magic"), std::string::npos);
}

TEST(SharedObject, KeysAreTheSameInEveryProcess) {
  EXPECT_EQ(shared_object_key(0xabc, 3, SharedObjectKind::kSnapshot, 2, 0x42),
            "hkv1:0000000000000abc:r3:s2:0000000000000042");
}

// An object overwritten in the store with one flipped byte reads back, and the reader's check
// refuses it: zero wrong bytes served.
TEST_F(SharedStoreTest, ACorruptedObjectInTheStoreIsRefusedByTheReader) {
  const SharedObjectHeader h{SharedObjectKind::kKvBlock, 7, 8};
  const Bytes payload = random_bytes(64 << 10, 5);
  Bytes object = encode_shared_object(h, payload);
  const std::vector<std::string> key = {shared_object_key(7, 0, h.kind, 0, 99)};
  ASSERT_EQ(put_all(*store_, key, {object})[0], StoreOutcome::kOk);
  ASSERT_EQ(store_->remove(key)[0], StoreOutcome::kOk);
  object[kSharedObjectHeaderBytes + 1234] ^= std::byte{0x80};  // what a faulty writer left
  ASSERT_EQ(put_all(*store_, key, {object})[0], StoreOutcome::kOk);
  auto [got, bytes] = get_all(*store_, key, 1 << 20);
  ASSERT_EQ(got[0], StoreOutcome::kOk);
  Result<std::span<const std::byte>> open = open_shared_object(bytes[0], h);
  ASSERT_FALSE(open.is_ok());
  EXPECT_NE(open.status().message().find("checksum"), std::string::npos);
}

// The server killed: every call fails (a miss) instead of waiting, and once it is back the store
// reconnects by itself.
TEST_F(SharedStoreTest, AKilledServerIsAMissNotAStallAndTheStoreReconnects) {
  const std::vector<std::string> key = {"hkv1:test:kill"};
  ASSERT_EQ(put_all(*store_, key, {random_bytes(4096, 6)})[0], StoreOutcome::kOk);
  server_->kill();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(get_all(*store_, key, 8192).first[0], StoreOutcome::kFailed);
  }
  EXPECT_GE(store_->stats().failures, 20u);
  ASSERT_TRUE(server_->restart());
  // The restarted server is empty (no persistence): after the backoff the key reads as missing.
  StoreOutcome o = StoreOutcome::kFailed;
  for (int i = 0; i < 200 && o == StoreOutcome::kFailed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    o = get_all(*store_, key, 8192).first[0];
  }
  EXPECT_EQ(o, StoreOutcome::kMissing);
  EXPECT_GE(store_->stats().reconnects, 1u);
  EXPECT_EQ(put_all(*store_, key, {random_bytes(4096, 7)})[0], StoreOutcome::kOk);
}

// A frozen server (SIGSTOP) answers nothing: the batch fails after the configured timeout and
// the caller goes on; thawed, the store serves again.
TEST_F(SharedStoreTest, AFrozenServerTimesOutAndServesAgainWhenThawed) {
  const std::vector<std::string> keys = {"hkv1:test:a", "hkv1:test:b", "hkv1:test:c"};
  const std::vector<Bytes> values = {random_bytes(100, 8), random_bytes(200, 9),
                                     random_bytes(300, 10)};
  ASSERT_EQ(put_all(*store_, keys, values)[2], StoreOutcome::kOk);
  server_->freeze();
  for (StoreOutcome o : get_all(*store_, keys, 1024).first) EXPECT_EQ(o, StoreOutcome::kFailed);
  server_->thaw();
  std::vector<StoreOutcome> got;
  std::vector<Bytes> bytes;
  for (int i = 0; i < 200; ++i) {
    std::tie(got, bytes) = get_all(*store_, keys, 1024);
    if (got[0] != StoreOutcome::kFailed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(got[i], StoreOutcome::kOk) << i;
    EXPECT_EQ(bytes[i], values[i]);
  }
}

TEST(SharedStore, BadConfigurationNamesTheField) {
  RedisStoreConfig c;
  c.host = "";
  EXPECT_NE(open_redis_store(c).status().message().find("host"), std::string::npos);
  c = RedisStoreConfig{};
  c.port = 0;
  EXPECT_NE(open_redis_store(c).status().message().find("port"), std::string::npos);
  c = RedisStoreConfig{};
  c.timeout = std::chrono::milliseconds(0);
  EXPECT_NE(open_redis_store(c).status().message().find("timeout"), std::string::npos);
  c = RedisStoreConfig{};
  c.reconnect_backoff = std::chrono::milliseconds(5000);
  EXPECT_NE(open_redis_store(c).status().message().find("reconnect_backoff"), std::string::npos);
}

// Nothing listens: ping names the address, calls fail at once.
TEST(SharedStore, NoServerIsAnErrorNamingTheAddress) {
  RedisStoreConfig c;
  c.port = 1;  // privileged, never a redis here
  Result<std::unique_ptr<SharedStore>> s = open_redis_store(c);
  ASSERT_TRUE(s.is_ok());
  const Status st = (*s)->ping();
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("127.0.0.1:1"), std::string::npos) << st.message();
  EXPECT_EQ((*s)->exists(std::vector<std::string>{"k"})[0], StoreOutcome::kFailed);
}

}  // namespace
}  // namespace hybridkv
