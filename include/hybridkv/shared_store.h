// A store shared by every serving instance (DESIGN §8a): the tier below host and disk. The
// interface follows Mooncake Store's C API (batched put, get into the caller's buffers, exists,
// remove) so that a Mooncake backend can follow the Redis one. Every call is one pipelined round
// trip for the whole batch, and every key gets its own outcome. A store that is down, killed or
// frozen answers kFailed within `timeout` (and, while it stays down, at once until the next
// reconnect attempt): serving never waits on it, and the caller counts a miss.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hybridkv/status.h"

namespace hybridkv {

enum class StoreOutcome : uint8_t {
  kOk,        // done (get: the value is in the buffer; exists: present; remove: removed)
  kMissing,   // no such key
  kExists,    // put: the key was already written (objects are written once, whole)
  kTooLarge,  // get: the value does not fit the buffer (nothing copied)
  kFailed,    // the store did not answer: down, killed, timed out, or an error reply
};

const char* store_outcome_name(StoreOutcome outcome);

// Counters since the store was opened.
struct StoreStats {
  uint64_t puts = 0, gets = 0, hits = 0, misses = 0;
  uint64_t failures = 0;    // keys answered kFailed
  uint64_t reconnects = 0;  // connections made after the first
  uint64_t bytes_put = 0, bytes_got = 0;
  uint64_t redirects = 0;       // cluster: MOVED and ASK replies followed
  uint64_t slot_refreshes = 0;  // cluster: slot maps read (CLUSTER SLOTS)
};

// What a manager's shared tier did (KvCacheManager::shared_stats).
struct SharedTierStats {
  uint64_t objects_published = 0;  // written by this manager
  uint64_t objects_present = 0;    // already there (written once: another instance was first)
  uint64_t objects_dropped = 0;    // the queue was full: not written
  uint64_t publish_failures = 0;   // the store did not answer
  uint64_t bytes_published = 0;
  uint64_t fetches = 0;     // fetch_shared calls
  uint64_t hit_tokens = 0;  // tokens the fetches brought into the tree
  uint64_t objects_fetched = 0;
  uint64_t bytes_fetched = 0;
  uint64_t objects_corrupt = 0;  // failed their checks: deleted, a miss
  uint64_t store_failures = 0;   // lookups and gets the store did not answer: misses
  uint64_t fetches_skipped = 0;  // slower than recomputing (prefill_tokens_per_s)
};

// What one fetch_shared call found.
struct SharedFetch {
  uint64_t local_tokens = 0;  // tokens of the prompt the local tree already could serve
  uint64_t hit_tokens = 0;    // tokens the local tree can serve now (local + fetched)
  uint64_t objects_fetched = 0;
  uint64_t bytes_fetched = 0;
  uint64_t objects_corrupt = 0;
  uint64_t store_failures = 0;
  bool skipped = false;  // the hit's bytes would take longer to fetch than to recompute
};

class SharedStore {
 public:
  virtual ~SharedStore() = default;

  // Writes each value under its key unless the key exists: concurrent publishers of one object
  // write it once, and a reader never sees part of one (a writer that dies mid-put wrote nothing).
  virtual std::vector<StoreOutcome> put(std::span<const std::string> keys,
                                        std::span<const std::span<const std::byte>> values) = 0;
  // Reads each key's value into its buffer and its length into sizes[i].
  virtual std::vector<StoreOutcome> get(std::span<const std::string> keys,
                                        std::span<const std::span<std::byte>> buffers,
                                        std::span<uint64_t> sizes) = 0;
  // kOk where the key is present, kMissing where not.
  virtual std::vector<StoreOutcome> exists(std::span<const std::string> keys) = 0;
  virtual std::vector<StoreOutcome> remove(std::span<const std::string> keys) = 0;
  // Whether the store answers now; the error names the address.
  virtual Status ping() = 0;
  virtual StoreStats stats() const = 0;
};

struct RedisStoreConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 6379;
  std::chrono::milliseconds timeout{250};                 // connect, send, and every reply
  std::chrono::milliseconds reconnect_backoff{50};        // the first wait after a failure
  std::chrono::milliseconds max_reconnect_backoff{2000};  // doubling stops here
  // Redis Cluster: host:port is a node to learn the cluster from. Each key goes to the master
  // of its hash slot (CRC16 of the key, as every cluster client computes it); a batch is one
  // pipelined round trip per master it touches; MOVED and ASK redirects are followed; after a
  // node fails the slot map is read again, so a replica that took over serves its slots.
  bool cluster = false;
};

// A store on one Redis server, or a Redis Cluster (hiredis). The servers need not be up yet:
// calls fail until they are. Refused: an empty host, port 0, a timeout or backoff of 0 (the
// message names the field).
Result<std::unique_ptr<SharedStore>> open_redis_store(const RedisStoreConfig& config);

}  // namespace hybridkv
