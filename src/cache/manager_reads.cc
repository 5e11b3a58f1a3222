// What the whole manager reports (cache/manager_reads.h).
#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

std::shared_mutex& ManagerReads::mutex() const { return core_.mu_; }
const storage::Storage& ManagerReads::storage() const { return core_.storage_; }
const prefix::PrefixIndex& ManagerReads::index() const { return core_.index_; }

ReuseMatch ManagerReads::probe(prefix::BlockHasher& hasher, const ReuseScope& scope,
                               std::span<const int32_t> tokens,
                               std::span<const MultimodalItem> multimodal) const {
  std::shared_lock lock(core_.mu_);
  return core_.index_.match(hasher, scope, tokens, multimodal).match;
}

std::vector<CacheEvent> ManagerReads::take_events() {
  std::unique_lock lock(core_.mu_);
  return core_.index_.take_events();
}

ReuseStats ManagerReads::reuse_stats() const {
  std::shared_lock lock(core_.mu_);
  return core_.index_.stats();
}

ReuseStats ManagerReads::take_reuse_stats() {
  std::unique_lock lock(core_.mu_);
  return core_.index_.take_stats();
}

IterationStats ManagerReads::take_iteration_stats() {
  std::unique_lock lock(core_.mu_);
  return core_.storage_.take_stats();
}

}  // namespace hybridkv::cache_detail
