// SharedTier: the manager's side of the tier shared by every serving instance (DESIGN §8a,
// ManagerConfig::shared). It names objects (the tree's chained block key, the model-and-layout
// fingerprint, the rank), writes them in the background and counts what the fetches found. A
// commit only queues copies of the pages' slots into host buffers on the backend's copy queue
// (Storage::copy_out) and hands the buffers over: the publisher thread waits for those copies,
// seals each object (header, checksum) and writes it. The step never reads a page's bytes and
// never waits for the store. The fetch itself (cache/shared_fetch.cc) runs in the manager.
//
// fetch_shared_async runs fetches on the tier's fetcher thread.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/plan.h"
#include "hybridkv/reuse.h"
#include "hybridkv/shared_object.h"
#include "hybridkv/shared_store.h"
#include "memory/backend.h"

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
  // `backend` runs the copies and gives the buffers; it outlives the tier.
  SharedTier(const StoragePlan& plan, const SharedTierConfig& config,
             memory::MemoryBackend& backend);
  ~SharedTier();  // writes what is queued, then stops
  SharedTier(const SharedTier&) = delete;
  SharedTier& operator=(const SharedTier&) = delete;

  // One object to write: its key, its header, and its bytes: `bytes` of `buffer`, the payload
  // after kSharedObjectHeaderBytes (written by a copy), header and checksum sealed on writing.
  struct Object {
    std::string key;
    SharedObjectHeader header;
    memory::HostBuffer buffer;
    size_t bytes = 0;
    uint64_t page_bytes = 0;  // the page's bytes (counted as published, modelled or not)
  };
  std::string key(SharedObjectKind kind, CacheGroupId group, const BlockKey& chain) const;
  SharedObjectHeader header(SharedObjectKind kind, std::span<const int32_t> tokens) const;
  // An object with a buffer for its payload (a written object's, when one of that size is
  // spare; else new from the backend), its room in the queue taken; nullopt (counted as
  // dropped) when the queue is full (max_queued_objects, max_queued_bytes).
  // `page_bytes`: the page's; the payload carries them (none when modelled).
  std::optional<Object> object(std::string key, const SharedObjectHeader& header,
                               uint64_t page_bytes);
  // Queues objects (made by object()) whose payloads the copies of `ready` write.
  void publish(CopyEvent ready, std::vector<Object> objects);
  // Returns once everything queued has been written (or failed).
  void drain();

  SharedStore& store() const { return *store_; }
  // The none backend's objects: no payload (a page's bytes are modelled, not kept).
  bool modelled() const { return modelled_; }
  // The payload of an object for a page of `page_bytes` (0 when modelled).
  uint64_t payload_bytes(uint64_t page_bytes) const { return modelled_ ? 0 : page_bytes; }
  uint32_t max_lookup_blocks() const { return max_lookup_blocks_; }
  SharedTierStats stats() const;
  // Whether fetching `bytes` would take longer than computing `tokens` (the configured rates).
  bool slower_than_recomputing(uint64_t bytes, uint64_t tokens) const;
  // What a fetch found (cache/shared_fetch.cc).
  void count_fetch(const SharedFetch& f);
  // Runs `fetch` on the fetcher thread (one at a time, in the order asked); its future gets
  // the result. Fetches not started when the tier stops get kFailedPrecondition.
  std::future<Result<SharedFetch>> run_fetch(std::function<Result<SharedFetch>()> fetch);

 private:
  struct Queued {
    CopyEvent ready;
    Object object;
  };
  struct Fetch {
    std::function<Result<SharedFetch>()> run;
    std::promise<Result<SharedFetch>> done;
  };
  void run();
  void run_fetches();
  void write(std::vector<Queued>& batch);
  void recycle(memory::HostBuffer buffer, size_t bytes);

  const std::shared_ptr<SharedStore> store_;
  memory::MemoryBackend& backend_;
  const bool modelled_;
  const uint64_t fingerprint_;
  const uint32_t rank_;
  const uint32_t max_queued_;
  const uint64_t max_queued_bytes_;
  const uint32_t max_lookup_blocks_;
  const double prefill_tokens_per_s_;
  const double fetch_bytes_per_s_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Queued> queue_;
  uint64_t taken_objects_ = 0, taken_bytes_ = 0;  // room taken: queued, being made or written
  bool writing_ = false;
  bool stop_ = false;
  SharedTierStats stats_;
  // Buffers of written objects by size, for the next objects of that size (at most
  // kSpareBytes in all): pinned buffers are slow to make.
  std::map<size_t, std::vector<memory::HostBuffer>> spare_;
  uint64_t spare_bytes_ = 0;
  std::condition_variable fetch_wake_;
  std::deque<Fetch> fetches_;
  std::thread writer_;  // last: started when everything above is ready
  std::thread fetcher_;
};

// The fingerprint of a model's pages: the model id, tokens per block, every cache group's kind,
// policy, window and layers, every pool group's pools and the snapshot dtype (two instances
// share objects only when these agree); `modelled`: objects without bytes (the none backend),
// never mixed with real ones.
uint64_t layout_fingerprint(const StoragePlan& plan, const std::string& model_id,
                            bool modelled = false);

}  // namespace hybridkv::cache_detail
