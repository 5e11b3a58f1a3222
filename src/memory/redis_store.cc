// The shared tier on one Redis server through hiredis (hybridkv/shared_store.h): one connection,
// serialized by a mutex; every batch one pipelined round trip (redis_connection.h) of the
// commands of redis_batch.h. A Redis Cluster is redis_cluster_store.cc.
#include <mutex>

#include "hybridkv/shared_store.h"
#include "memory/redis_batch.h"
#include "memory/redis_connection.h"

namespace hybridkv {

const char* store_outcome_name(StoreOutcome outcome) {
  switch (outcome) {
    case StoreOutcome::kOk:
      return "ok";
    case StoreOutcome::kMissing:
      return "missing";
    case StoreOutcome::kExists:
      return "exists";
    case StoreOutcome::kTooLarge:
      return "too large";
    case StoreOutcome::kFailed:
      return "failed";
  }
  return "?";
}

namespace memory {

RedisTimeouts timeouts_of(const RedisStoreConfig& c) {
  return {c.timeout, c.reconnect_backoff, c.max_reconnect_backoff};
}

std::unique_ptr<SharedStore> make_redis_cluster_store(const RedisStoreConfig& config);

namespace {

using Op = KeyedBatch::Op;

class RedisStore final : public SharedStore {
 public:
  explicit RedisStore(const RedisStoreConfig& config)
      : conn_(config.host, config.port, timeouts_of(config)) {}

  std::vector<StoreOutcome> put(std::span<const std::string> keys,
                                std::span<const std::span<const std::byte>> values) override {
    return run({.op = Op::kPut, .keys = keys, .values = values});
  }
  std::vector<StoreOutcome> get(std::span<const std::string> keys,
                                std::span<const std::span<std::byte>> buffers,
                                std::span<uint64_t> sizes) override {
    return run({.op = Op::kGet, .keys = keys, .buffers = buffers, .sizes = sizes});
  }
  std::vector<StoreOutcome> exists(std::span<const std::string> keys) override {
    return run({.op = Op::kExists, .keys = keys});
  }
  std::vector<StoreOutcome> remove(std::span<const std::string> keys) override {
    return run({.op = Op::kRemove, .keys = keys});
  }

  Status ping() override {
    std::lock_guard lock(mu_);
    RedisCommand c;
    c.add("PING", 4);
    const Reply r = conn_.command(c);
    if (r && r->type == REDIS_REPLY_STATUS) return Status::ok();
    return Status(StatusCode::kIoError,
                  "redis " + conn_.address() + ": " +
                      (r ? std::string("unexpected reply to PING") : conn_.last_error()));
  }

  StoreStats stats() const override {
    std::lock_guard lock(mu_);
    StoreStats s = stats_;
    s.reconnects = conn_.reconnects();
    return s;
  }

 private:
  std::vector<StoreOutcome> run(const KeyedBatch& b) {
    std::lock_guard lock(mu_);
    b.count_calls(stats_);
    std::vector<RedisCommand> commands;
    commands.reserve(b.keys.size());
    for (size_t i = 0; i < b.keys.size(); ++i) commands.push_back(b.command(i));
    const std::vector<Reply> replies = conn_.pipeline(commands);
    std::vector<StoreOutcome> out(b.keys.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = b.outcome(i, replies[i].get(), stats_);
    return out;
  }

  mutable std::mutex mu_;
  RedisConnection conn_;
  StoreStats stats_;
};

}  // namespace
}  // namespace memory

Result<std::unique_ptr<SharedStore>> open_redis_store(const RedisStoreConfig& config) {
  if (config.host.empty()) return Status::invalid("RedisStoreConfig.host: empty");
  if (config.port == 0) return Status::invalid("RedisStoreConfig.port: 0");
  if (config.timeout.count() <= 0) {
    return Status::invalid("RedisStoreConfig.timeout: " + std::to_string(config.timeout.count()) +
                           " ms must be > 0");
  }
  if (config.reconnect_backoff.count() <= 0 ||
      config.max_reconnect_backoff < config.reconnect_backoff) {
    return Status::invalid(
        "RedisStoreConfig.reconnect_backoff: " + std::to_string(config.reconnect_backoff.count()) +
        " ms must be > 0 and at most max_reconnect_backoff (" +
        std::to_string(config.max_reconnect_backoff.count()) + " ms)");
  }
  if (config.cluster) return memory::make_redis_cluster_store(config);
  return std::unique_ptr<SharedStore>(std::make_unique<memory::RedisStore>(config));
}

}  // namespace hybridkv
