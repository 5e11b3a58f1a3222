#include "memory/redis_connection.h"

#include <algorithm>
#include <utility>

namespace hybridkv::memory {

namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000),
                 static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

}  // namespace

RedisConnection::RedisConnection(std::string host, uint16_t port, RedisTimeouts timeouts)
    : host_(std::move(host)),
      port_(port),
      timeouts_(timeouts),
      backoff_(timeouts.reconnect_backoff) {}

std::vector<Reply> RedisConnection::pipeline(const std::vector<RedisCommand>& commands) {
  std::vector<Reply> replies(commands.size());
  if (commands.empty() || !connect()) return replies;
  for (const RedisCommand& c : commands) {
    if (redisAppendCommandArgv(ctx_, static_cast<int>(c.argv.size()),
                               const_cast<const char**>(c.argv.data()), c.len.data()) != REDIS_OK) {
      fail();
      return replies;
    }
  }
  for (Reply& r : replies) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      fail();
      return replies;
    }
    r.reset(static_cast<redisReply*>(raw));
  }
  return replies;
}

Reply RedisConnection::command(const RedisCommand& c) {
  std::vector<Reply> r = pipeline({c});
  return std::move(r.front());
}

bool RedisConnection::connect() {
  if (ctx_ != nullptr) return true;
  if (std::chrono::steady_clock::now() < next_attempt_) return false;
  ctx_ = redisConnectWithTimeout(host_.c_str(), port_, to_timeval(timeouts_.timeout));
  if (ctx_ == nullptr || ctx_->err != 0 ||
      redisSetTimeout(ctx_, to_timeval(timeouts_.timeout)) != REDIS_OK) {
    fail();
    backoff_ = std::min(backoff_ * 2, timeouts_.max_reconnect_backoff);
    return false;
  }
  reconnects_ += connected_before_ ? 1 : 0;
  connected_before_ = true;
  backoff_ = timeouts_.reconnect_backoff;
  return true;
}

void RedisConnection::fail() {
  last_error_ = ctx_ == nullptr  ? "cannot allocate a connection"
                : ctx_->err != 0 ? ctx_->errstr
                                 : "no reply";
  disconnect();
  next_attempt_ = std::chrono::steady_clock::now() + backoff_;
}

void RedisConnection::disconnect() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

}  // namespace hybridkv::memory
