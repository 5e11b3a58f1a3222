// KvCache and KvCacheManager: thin handles that lock the core's mutex.
#include "hybridkv/kv_cache.h"

#include <utility>

#include "cache/manager_core.h"
#include "hybridkv/manager.h"
#include "plan/plan_internal.h"

namespace hybridkv {

using cache_detail::ManagerCore;

const char* cache_state_name(CacheState state) {
  switch (state) {
    case CacheState::kSuspended:
      return "SUSPENDED";
    case CacheState::kActive:
      return "ACTIVE";
    case CacheState::kClosed:
      return "CLOSED";
  }
  return "?";
}

KvCache::~KvCache() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  core_->destroy(id_);
}

CacheState KvCache::state() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->caches[id_].state;
}
uint64_t KvCache::capacity() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->caches[id_].capacity;
}
uint64_t KvCache::history() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->caches[id_].history;
}
uint32_t KvCache::beam_width() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->caches[id_].beam_width;
}
CopyEvent KvCache::ready_event() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->caches[id_].ready;
}

Status KvCache::resume(Stream stream, const std::vector<CacheGroupId>& optional_groups) {
  (void)stream;  // the host and none backends order copies on their own queue
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->resume(id_, &optional_groups);
}
ReuseMatch KvCache::reuse_match() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->caches[id_].match;
}
Status KvCache::commit(std::span<const int32_t> tokens, bool is_end) {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->commit(id_, tokens, is_end);
}
uint64_t KvCache::committed_tokens() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->caches[id_].committed;
}
Status KvCache::stop_committing() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->stop_committing(id_);
}
Status KvCache::plan_snapshot_drop() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->plan_snapshot_drop(id_);
}
Status KvCache::release_planned_drops() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->release_planned_drops(id_);
}
Status KvCache::suspend() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->suspend(id_);
}
Status KvCache::resize(uint64_t capacity, uint64_t history) {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->resize(id_, capacity, history);
}
Status KvCache::close() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->close(id_);
}
Result<std::span<const int32_t>> KvCache::block_table(CacheGroupId group, uint32_t beam) const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->block_table(id_, group, beam);
}
Result<int32_t> KvCache::state_index(CacheGroupId group, uint32_t beam) const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->state_index(id_, group, beam);
}
Status KvCache::set_index_buffer(CacheGroupId group, uint32_t beam, std::span<int32_t> buffer) {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->set_index_buffer(id_, group, beam, buffer);
}
Status KvCache::set_block_priority(uint64_t first_block, uint64_t end_block, int32_t priority) {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->set_block_priority(id_, first_block, end_block, priority);
}

// --- KvCacheManager ---

KvCacheManager::KvCacheManager(std::unique_ptr<ManagerCore> core) : core_(std::move(core)) {}
KvCacheManager::~KvCacheManager() = default;

Result<std::unique_ptr<KvCacheManager>> KvCacheManager::create(const ManagerConfig& config,
                                                               const BackendOptions& options) {
  Result<StoragePlan> plan = StoragePlan::build(config);
  if (!plan) return plan.status();
  Result<std::unique_ptr<memory::MemoryBackend>> backend = memory::make_backend(options);
  if (!backend) return backend.status();
  if (Status s = (*backend)->allocate(*plan); !s) return s;
  auto core = std::make_unique<ManagerCore>(std::move(plan).value(), std::move(backend).value());
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(std::move(core)));
}

const StoragePlan& KvCacheManager::plan() const { return core_->plan; }

Result<std::unique_ptr<KvCache>> KvCacheManager::create_kv_cache(const CacheOptions& options) {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  Result<uint32_t> id = core_->create(options);
  if (!id) return id.status();
  return std::unique_ptr<KvCache>(new KvCache(core_.get(), *id));
}

ReuseMatch KvCacheManager::probe_reuse(const ReuseScope& scope, std::span<const int32_t> tokens,
                                       std::span<const MultimodalItem> multimodal) const {
  // One hasher per thread and hash kind: probes run at once, and setting a hasher up costs
  // more than hashing a short prompt.
  thread_local std::unique_ptr<prefix::BlockHasher> hashers[2];
  const BlockHash kind = core_->plan.config().block_hash;
  std::unique_ptr<prefix::BlockHasher>& hasher = hashers[static_cast<size_t>(kind)];
  if (!hasher) hasher = std::make_unique<prefix::BlockHasher>(kind);
  std::shared_lock<std::shared_mutex> lock(core_->mu);
  return core_->match(*hasher, scope, tokens, multimodal).match;
}

void KvCacheManager::clear_reusable_blocks() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  core_->clear_reusable_blocks();
}

std::vector<CacheEvent> KvCacheManager::take_events() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return std::exchange(core_->events, {});
}

ReuseStats KvCacheManager::reuse_stats() const {
  std::shared_lock<std::shared_mutex> lock(core_->mu);
  ReuseStats out = core_->reuse_stats;
  out.tree_blocks = core_->tree.size();
  return out;
}

IterationStats KvCacheManager::take_iteration_stats() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  IterationStats out = core_->storage.stats;
  core_->storage.stats = IterationStats{};
  return out;
}

StorageStats KvCacheManager::storage_stats() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  StorageStats out;
  for (size_t t = 0; t < core_->storage.num_tiers(); ++t) {
    TierStorage tier{core_->storage.tier_kind(t), {}};
    for (const PoolGroup& pg : core_->plan.pool_groups()) {
      tier.pool_groups.push_back({pg.id, core_->storage.total_slots(t, pg.id),
                                  core_->storage.free_slots(t, pg.id),
                                  core_->storage.evictable_slots(t, pg.id)});
    }
    out.tiers.push_back(std::move(tier));
  }
  out.live_caches = core_->live_caches;
  out.active_caches = core_->active_caches;
  return out;
}

uint64_t KvCacheManager::clamp_max_seq_len_for_mem(uint64_t max_seq_len) const {
  const std::optional<uint64_t> longest = core_->plan.max_request_tokens();
  return longest ? std::min(*longest, max_seq_len) : max_seq_len;
}

Status KvCacheManager::shutdown() {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  if (core_->live_caches > 0) {
    return Status(StatusCode::kFailedPrecondition,
                  "shutdown refused: " + std::to_string(core_->live_caches) +
                      " caches are still open (close them first)");
  }
  core_->shut_down = true;
  return Status::ok();
}

void KvCacheManager::wait(CopyEvent event) { core_->backend->wait(event); }

std::byte* KvCacheManager::slot_address(TierKind tier, PoolGroupId pool_group, uint32_t pool,
                                        uint32_t slot) const {
  return core_->storage.slot_address(tier, pool_group, pool, slot);
}

void KvCacheManager::set_copy_gate(bool open) { core_->backend->set_copy_gate(open); }

std::string KvCacheManager::check_invariants() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->check();
}

std::vector<KvCacheManager::TreePage> KvCacheManager::debug_tree_pages() const {
  std::shared_lock<std::shared_mutex> lock(core_->mu);
  std::vector<TreePage> out;
  for (prefix::NodeId n = 0; n < core_->tree.capacity(); ++n) {
    const prefix::Node& node = core_->tree.node(n);
    if (!node.live) continue;
    const auto pages = core_->tree.pages(n);
    for (size_t g = 0; g < pages.size(); ++g) {
      if (pages[g].page == storage::kNoPage) continue;
      const storage::Page& p = core_->storage.page(pages[g].page);
      out.push_back({node.key, CacheGroupId(static_cast<uint32_t>(g)), p.tier, p.pool_group, p.slot,
                     pages[g].coverage});
    }
  }
  return out;
}

std::string KvCacheManager::debug_snapshot() const {
  std::lock_guard<std::shared_mutex> lock(core_->mu);
  return core_->snapshot();
}

}  // namespace hybridkv
