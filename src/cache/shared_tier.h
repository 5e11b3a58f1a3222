// SharedTier: the manager's side of the tier shared by every serving instance (DESIGN §8a,
// ManagerConfig::shared). It names objects (the tree's chained block key, the model-and-layout
// fingerprint, the rank), writes them in the background (a publisher thread and a bounded queue:
// a commit copies the bytes out and returns; the store is never waited on), and counts what the
// fetches found. The fetch itself (cache/shared_fetch.cc) runs in the manager.
//
// Thread-safety: publish, drain and stats may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/plan.h"
#include "hybridkv/reuse.h"
#include "hybridkv/shared_object.h"
#include "hybridkv/shared_store.h"

namespace hybridkv::cache_detail {

// Block `block` of cache group `group` of a prompt (an SSM group: the snapshot at its end).
struct SharedBlock {
  uint64_t block;
  CacheGroupId group;
  bool operator<(const SharedBlock& o) const {
    return block != o.block ? block < o.block : group.value < o.group.value;
  }
};

class SharedTier {
 public:
  SharedTier(const StoragePlan& plan, const SharedTierConfig& config);
  ~SharedTier();  // writes what is queued, then stops
  SharedTier(const SharedTier&) = delete;
  SharedTier& operator=(const SharedTier&) = delete;

  // One object to write: its key and its encoded bytes.
  struct Object {
    std::string key;
    std::vector<std::byte> bytes;
  };
  std::string key(SharedObjectKind kind, CacheGroupId group, const BlockKey& chain) const;
  SharedObjectHeader header(SharedObjectKind kind, std::span<const int32_t> tokens) const;

  // Queues objects for the publisher; beyond max_queued_objects they are dropped (counted).
  void publish(std::vector<Object> objects);
  // Returns once everything queued has been written (or failed).
  void drain();

  SharedStore& store() const { return *store_; }
  uint32_t max_lookup_blocks() const { return max_lookup_blocks_; }
  SharedTierStats stats() const;
  // Whether fetching `bytes` would take longer than computing `tokens` (the configured rates).
  bool slower_than_recomputing(uint64_t bytes, uint64_t tokens) const;
  // What a fetch found (cache/shared_fetch.cc).
  void count_fetch(const SharedFetch& f);

 private:
  void run();

  const std::shared_ptr<SharedStore> store_;
  const uint64_t fingerprint_;
  const uint32_t rank_;
  const uint32_t max_queued_;
  const uint32_t max_lookup_blocks_;
  const double prefill_tokens_per_s_;
  const double fetch_bytes_per_s_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Object> queue_;
  bool writing_ = false;
  bool stop_ = false;
  SharedTierStats stats_;
  std::thread writer_;  // last: started when everything above is ready
};

// The fingerprint of a model's pages: the model id, tokens per block, every cache group's kind,
// policy, window and layers, every pool group's pools and the snapshot dtype (two instances
// share objects only when these agree).
uint64_t layout_fingerprint(const StoragePlan& plan, const std::string& model_id);

}  // namespace hybridkv::cache_detail
