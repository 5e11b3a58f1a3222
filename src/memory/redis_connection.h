// One connection to one Redis server (hiredis), shared by the single-server store and the
// cluster store (redis_store.cc, redis_cluster_store.cc).
//
// Batches are pipelined: every command appended, then every reply read, one round trip. A reply
// that does not come within the timeout, or a broken connection, fails the rest of the batch and
// drops the connection (a late reply would answer the wrong command); the next call reconnects
// only after a backoff that doubles while the server stays away, so a dead server costs a call no
// more than one failed connect per backoff period.
//
// Thread-safety: none; the store that owns it serializes every call.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hybridkv/shared_store.h"

namespace hybridkv::memory {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct RedisTimeouts {
  std::chrono::milliseconds timeout{250};
  std::chrono::milliseconds reconnect_backoff{50};
  std::chrono::milliseconds max_reconnect_backoff{2000};
};

// One command as argument strings (binary-safe).
struct RedisCommand {
  std::vector<const char*> argv;
  std::vector<size_t> len;
  void add(const void* data, size_t n) {
    argv.push_back(static_cast<const char*>(data));
    len.push_back(n);
  }
  void add(const std::string& s) { add(s.data(), s.size()); }
};

class RedisConnection {
 public:
  RedisConnection(std::string host, uint16_t port, RedisTimeouts timeouts);
  ~RedisConnection() { disconnect(); }
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  const std::string& last_error() const { return last_error_; }
  // Connections made after the first one.
  uint64_t reconnects() const { return reconnects_; }

  // Sends the commands as one pipeline and reads every reply: replies[i] answers commands[i],
  // null where the connection failed (from there on, every later one is null too).
  std::vector<Reply> pipeline(const std::vector<RedisCommand>& commands);
  // One command, one round trip (null on failure).
  Reply command(const RedisCommand& c);

 private:
  // False while the server is away (without waiting, inside a backoff period).
  bool connect();
  void disconnect();
  void fail();  // records the error, drops the connection, starts the backoff

  const std::string host_;
  const uint16_t port_;
  const RedisTimeouts timeouts_;
  redisContext* ctx_ = nullptr;
  bool connected_before_ = false;
  uint64_t reconnects_ = 0;
  std::chrono::steady_clock::time_point next_attempt_{};
  std::chrono::milliseconds backoff_;
  std::string last_error_;
};

}  // namespace hybridkv::memory
