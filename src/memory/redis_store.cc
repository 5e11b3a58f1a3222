// The shared tier on one Redis server through hiredis (hybridkv/shared_store.h).
//
// One connection, serialized by a mutex; every batch is pipelined: all commands appended, then
// all replies read, one round trip. Objects are written with SET NX (once, whole: Redis executes
// a command only when all of it has arrived, so a writer killed mid-put wrote nothing). A reply
// that does not come within the timeout, or a broken connection, fails the rest of the batch
// and drops the connection (a late reply would answer the wrong command); the next call
// reconnects only after a backoff that doubles while the server stays away, so a dead server
// costs a call no more than one failed connect per backoff period.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "hybridkv/shared_store.h"

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

namespace {

using Clock = std::chrono::steady_clock;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval to_timeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000),
                 static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

class RedisStore final : public SharedStore {
 public:
  explicit RedisStore(RedisStoreConfig config) : config_(std::move(config)) {
    backoff_ = config_.reconnect_backoff;
  }
  ~RedisStore() override { disconnect(); }

  std::vector<StoreOutcome> put(std::span<const std::string> keys,
                                std::span<const std::span<const std::byte>> values) override {
    std::lock_guard lock(mu_);
    stats_.puts += keys.size();
    auto reply = [&](size_t i, const redisReply& r) {
      if (r.type == REDIS_REPLY_NIL) return StoreOutcome::kExists;
      if (r.type != REDIS_REPLY_STATUS) return StoreOutcome::kFailed;
      stats_.bytes_put += values[i].size();
      return StoreOutcome::kOk;
    };
    return pipeline(
        keys.size(),
        [&](size_t i) {
          const char* argv[] = {"SET", keys[i].data(),
                                reinterpret_cast<const char*>(values[i].data()), "NX"};
          const size_t len[] = {3, keys[i].size(), values[i].size(), 2};
          return redisAppendCommandArgv(ctx_, 4, argv, len);
        },
        reply);
  }

  std::vector<StoreOutcome> get(std::span<const std::string> keys,
                                std::span<const std::span<std::byte>> buffers,
                                std::span<uint64_t> sizes) override {
    std::lock_guard lock(mu_);
    stats_.gets += keys.size();
    auto reply = [&](size_t i, const redisReply& r) {
      if (r.type == REDIS_REPLY_NIL) return StoreOutcome::kMissing;
      if (r.type != REDIS_REPLY_STRING) return StoreOutcome::kFailed;
      sizes[i] = r.len;
      if (r.len > buffers[i].size()) return StoreOutcome::kTooLarge;
      std::memcpy(buffers[i].data(), r.str, r.len);
      stats_.bytes_got += r.len;
      return StoreOutcome::kOk;
    };
    std::vector<StoreOutcome> out = keyed("GET", keys, reply);
    for (StoreOutcome o : out) {
      stats_.hits += o == StoreOutcome::kOk ? 1 : 0;
      stats_.misses += o == StoreOutcome::kOk ? 0 : 1;
    }
    return out;
  }

  std::vector<StoreOutcome> exists(std::span<const std::string> keys) override {
    std::lock_guard lock(mu_);
    return keyed("EXISTS", keys, counted);
  }

  std::vector<StoreOutcome> remove(std::span<const std::string> keys) override {
    std::lock_guard lock(mu_);
    return keyed("DEL", keys, counted);
  }

  Status ping() override {
    std::lock_guard lock(mu_);
    const std::string where = config_.host + ":" + std::to_string(config_.port);
    if (!connect()) return Status(StatusCode::kIoError, "redis " + where + ": " + last_error_);
    Reply r(static_cast<redisReply*>(redisCommand(ctx_, "PING")));
    if (!r || r->type != REDIS_REPLY_STATUS) {
      last_error_ = ctx_->err ? ctx_->errstr : "unexpected reply to PING";
      disconnect();
      return Status(StatusCode::kIoError, "redis " + where + ": " + last_error_);
    }
    return Status::ok();
  }

  StoreStats stats() const override {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  // An integer reply: 1 (present, removed) is kOk, 0 is kMissing.
  static StoreOutcome counted(size_t, const redisReply& r) {
    if (r.type != REDIS_REPLY_INTEGER) return StoreOutcome::kFailed;
    return r.integer > 0 ? StoreOutcome::kOk : StoreOutcome::kMissing;
  }

  template <typename OnReply>
  std::vector<StoreOutcome> keyed(const char* command, std::span<const std::string> keys,
                                  OnReply on_reply) {
    return pipeline(
        keys.size(),
        [&](size_t i) {
          const char* argv[] = {command, keys[i].data()};
          const size_t len[] = {std::strlen(command), keys[i].size()};
          return redisAppendCommandArgv(ctx_, 2, argv, len);
        },
        on_reply);
  }

  // Appends n commands, then reads n replies. Requires mu_.
  template <typename Append, typename OnReply>
  std::vector<StoreOutcome> pipeline(size_t n, Append append, OnReply on_reply) {
    std::vector<StoreOutcome> out(n, StoreOutcome::kFailed);
    if (n == 0) return out;
    if (!connect()) {
      stats_.failures += n;
      return out;
    }
    for (size_t i = 0; i < n; ++i) {
      if (append(i) != REDIS_OK) return broken(out, 0);
    }
    for (size_t i = 0; i < n; ++i) {
      void* raw = nullptr;
      if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) return broken(out, i);
      Reply r(static_cast<redisReply*>(raw));
      out[i] = on_reply(i, *r);
      stats_.failures += out[i] == StoreOutcome::kFailed ? 1 : 0;
    }
    return out;
  }

  // The connection failed at reply `from`: the rest of the batch fails and the connection goes.
  std::vector<StoreOutcome>& broken(std::vector<StoreOutcome>& out, size_t from) {
    last_error_ = ctx_->err ? ctx_->errstr : "no reply";
    stats_.failures += out.size() - from;
    disconnect();
    next_attempt_ = Clock::now() + backoff_;
    return out;
  }

  // Requires mu_. False while the server is away (without waiting, inside a backoff period).
  bool connect() {
    if (ctx_ != nullptr) return true;
    if (Clock::now() < next_attempt_) return false;
    ctx_ = redisConnectWithTimeout(config_.host.c_str(), config_.port, to_timeval(config_.timeout));
    if (ctx_ == nullptr || ctx_->err != 0 ||
        redisSetTimeout(ctx_, to_timeval(config_.timeout)) != REDIS_OK) {
      last_error_ = ctx_ == nullptr ? "cannot allocate a connection" : ctx_->errstr;
      disconnect();
      next_attempt_ = Clock::now() + backoff_;
      backoff_ = std::min(backoff_ * 2, config_.max_reconnect_backoff);
      return false;
    }
    stats_.reconnects += connected_before_ ? 1 : 0;
    connected_before_ = true;
    backoff_ = config_.reconnect_backoff;
    return true;
  }

  void disconnect() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
  }

  const RedisStoreConfig config_;
  mutable std::mutex mu_;
  redisContext* ctx_ = nullptr;
  bool connected_before_ = false;
  Clock::time_point next_attempt_{};
  std::chrono::milliseconds backoff_;
  std::string last_error_;
  StoreStats stats_;
};

}  // namespace

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
  return std::unique_ptr<SharedStore>(std::make_unique<RedisStore>(config));
}

}  // namespace hybridkv
