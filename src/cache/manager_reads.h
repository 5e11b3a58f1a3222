// ManagerReads: what the whole manager reports, apart from any one request: reuse statistics
// and cache events (the index's), iteration statistics (storage's), a reuse probe that changes
// nothing, the invariant checker and the metadata snapshot (DESIGN §9). It holds no state of
// its own; every method takes the core's lock (shared, or exclusive where it takes counters).
#pragma once

#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "hybridkv/reuse.h"
#include "hybridkv/stats.h"
#include "prefix/prefix_index.h"
#include "storage/storage.h"

namespace hybridkv::cache_detail {

class ManagerCore;

class ManagerReads {
 public:
  explicit ManagerReads(ManagerCore& core) : core_(core) {}

  ReuseMatch probe(prefix::BlockHasher& hasher, const ReuseScope& scope,
                   std::span<const int32_t> tokens,
                   std::span<const MultimodalItem> multimodal) const;
  std::vector<CacheEvent> take_events();
  ReuseStats reuse_stats() const;
  ReuseStats take_reuse_stats();
  IterationStats take_iteration_stats();

  // Every invariant of slots, pages, queues, tree and caches (empty when all hold), and the
  // whole metadata state for before/after equality. The testing library exposes both.
  std::string check() const;
  std::string snapshot() const;
  // Calls `fn(storage, index)` under the shared lock: read-only access for diagnostics.
  template <typename Fn>
  void read_locked(Fn&& fn) const {
    std::shared_lock lock(mutex());
    fn(storage(), index());
  }

 private:
  std::shared_mutex& mutex() const;
  const storage::Storage& storage() const;
  const prefix::PrefixIndex& index() const;

  ManagerCore& core_;
};

}  // namespace hybridkv::cache_detail
