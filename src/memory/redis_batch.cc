#include "memory/redis_batch.h"

#include <cstring>

namespace hybridkv::memory {

RedisCommand KeyedBatch::command(size_t i) const {
  static const std::string kSet = "SET", kNx = "NX", kGet = "GET", kExists = "EXISTS", kDel = "DEL";
  RedisCommand c;
  switch (op) {
    case Op::kPut:
      c.add(kSet);
      c.add(keys[i]);
      c.add(values[i].data(), values[i].size());
      c.add(kNx);
      break;
    case Op::kGet:
      c.add(kGet), c.add(keys[i]);
      break;
    case Op::kExists:
      c.add(kExists), c.add(keys[i]);
      break;
    case Op::kRemove:
      c.add(kDel), c.add(keys[i]);
      break;
  }
  return c;
}

void KeyedBatch::count_calls(StoreStats& stats) const {
  if (op == Op::kPut) stats.puts += keys.size();
  if (op == Op::kGet) stats.gets += keys.size();
}

StoreOutcome KeyedBatch::outcome(size_t i, const redisReply* r, StoreStats& stats) const {
  StoreOutcome out = StoreOutcome::kFailed;
  if (r == nullptr) {
    out = StoreOutcome::kFailed;
  } else if (op == Op::kPut) {
    if (r->type == REDIS_REPLY_NIL) out = StoreOutcome::kExists;
    if (r->type == REDIS_REPLY_STATUS) {
      stats.bytes_put += values[i].size();
      out = StoreOutcome::kOk;
    }
  } else if (op == Op::kGet) {
    if (r->type == REDIS_REPLY_NIL) out = StoreOutcome::kMissing;
    if (r->type == REDIS_REPLY_STRING) {
      sizes[i] = r->len;
      out = StoreOutcome::kTooLarge;
      if (r->len <= buffers[i].size()) {
        std::memcpy(buffers[i].data(), r->str, r->len);
        stats.bytes_got += r->len;
        out = StoreOutcome::kOk;
      }
    }
  } else if (r->type == REDIS_REPLY_INTEGER) {  // EXISTS, DEL: 1 present / removed, 0 not
    out = r->integer > 0 ? StoreOutcome::kOk : StoreOutcome::kMissing;
  }
  stats.failures += out == StoreOutcome::kFailed ? 1 : 0;
  if (op == Op::kGet) {
    stats.hits += out == StoreOutcome::kOk ? 1 : 0;
    stats.misses += out == StoreOutcome::kOk ? 0 : 1;
  }
  return out;
}

}  // namespace hybridkv::memory
