// SharedLink: the manager's side of the tier shared by every serving instance (DESIGN §8a):
// what a commit publishes (shared_io.cc) and fetching a prompt's blocks from the store into
// this manager's host tier (shared_fetch.cc). It owns the SharedTier (its writer, fetcher and
// queue); without ManagerConfig::shared.store it has none, publishes nothing and answers
// fetches kFailedPrecondition.
//
// Store round trips never hold the core's lock; reading and changing the tree and pages does.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "cache/shared_tier.h"
#include "hybridkv/shared_store.h"
#include "prefix/prefix_index.h"

namespace hybridkv::cache_detail {

class ManagerCore;

class SharedLink {
 public:
  explicit SharedLink(ManagerCore& core);

  Result<SharedFetch> fetch(const ReuseScope& scope, std::span<const int32_t> tokens);
  // The same fetch on the tier's own thread.
  std::future<Result<SharedFetch>> fetch_async(const ReuseScope& scope,
                                               std::vector<int32_t> tokens);
  SharedTierStats stats() const;
  // Waits until every queued object is written (or dropped).
  void flush();
  // Requires the core's lock (exclusive). `blocks`: full nodes a commit published KV at;
  // `snapshot`: the node it published snapshots at (kNoNode: none). Queues what is worth
  // sending; returns without waiting for a copy or the store.
  void publish(const std::vector<prefix::NodeId>& blocks, prefix::NodeId snapshot);

 private:
  bool has_recurrent_groups() const;
  // Whether a copy can read the page's bytes into host memory (a memory tier of a backend
  // with bytes).
  bool readable(PageId page) const;
  // The transfers between a page's slot (every pool, in order) and `host` (the slot's bytes
  // there, contiguous); none when the CPU cannot reach the page's memory (DISK).
  std::vector<PoolTransfer> slot_transfers(PageId page, std::byte* host) const;
  static SharedObjectKind kind_of(const CacheGroup& g);
  // The payload of a group's objects: its page's bytes (none with the none backend).
  uint64_t payload_bytes(const CacheGroup& g) const;
  void local_blocks(const ReuseScope& scope, std::span<const int32_t> tokens,
                    std::vector<BlockKey>& keys, std::set<SharedBlock>& local) const;
  std::set<SharedBlock> in_store(const std::vector<BlockKey>& keys,
                                 const std::set<SharedBlock>& local, SharedFetch& out) const;
  template <typename Have>
  uint64_t shared_hit_blocks(uint64_t blocks, Have&& have) const;
  void get_shared(const std::vector<SharedBlock>& need, const std::vector<BlockKey>& keys,
                  std::span<const int32_t> tokens, std::set<SharedBlock>& present,
                  std::map<SharedBlock, std::vector<std::byte>>& fetched, SharedFetch& out) const;
  Status adopt_shared(const ReuseScope& scope, std::span<const int32_t> tokens,
                      const std::vector<BlockKey>& keys, uint64_t hit,
                      std::map<SharedBlock, std::vector<std::byte>>& fetched, SharedFetch& out);
  void place_shared(const ReuseScope& scope, std::span<const int32_t> tokens, uint64_t hit,
                    storage::TierIndex tier, const std::vector<const SharedBlock*>& todo,
                    std::map<SharedBlock, std::vector<std::byte>>& fetched);

  ManagerCore& core_;
  std::unique_ptr<SharedTier> shared_;  // null: no shared tier
};

}  // namespace hybridkv::cache_detail
