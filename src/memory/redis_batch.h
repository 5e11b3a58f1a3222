// A batch of keyed store calls as Redis commands, and what each reply means (the same for one
// server and for a cluster): put is SET key value NX (written once, whole: Redis runs a command
// only when all of it has arrived, so a writer killed mid-put wrote nothing), get is GET into
// the caller's buffer, exists is EXISTS, remove is DEL.
#pragma once

#include <span>
#include <string>

#include "hybridkv/shared_store.h"
#include "memory/redis_connection.h"

namespace hybridkv::memory {

struct KeyedBatch {
  enum class Op : uint8_t { kPut, kGet, kExists, kRemove };
  Op op = Op::kGet;
  std::span<const std::string> keys = {};
  std::span<const std::span<const std::byte>> values = {};  // kPut
  std::span<const std::span<std::byte>> buffers = {};       // kGet
  std::span<uint64_t> sizes = {};                           // kGet

  RedisCommand command(size_t i) const;
  // The outcome of key i from its reply (counted in `stats`); null: the store did not answer.
  StoreOutcome outcome(size_t i, const redisReply* reply, StoreStats& stats) const;
  // Counts the calls before they are sent.
  void count_calls(StoreStats& stats) const;
};

}  // namespace hybridkv::memory
