// KvCache and KvCacheManager: thin handles over the shared ManagerCore (which locks).
#include "hybridkv/kv_cache.h"

#include <utility>

#include "cache/manager_core.h"
#include "hybridkv/manager.h"

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

KvCache::~KvCache() { core_->destroy(id_); }

CacheState KvCache::state() const { return core_->info(id_).state; }
uint64_t KvCache::capacity() const { return core_->info(id_).capacity; }
uint64_t KvCache::history() const { return core_->info(id_).history; }
uint32_t KvCache::beam_width() const { return core_->info(id_).beam_width; }
CopyEvent KvCache::ready_event() const { return core_->info(id_).ready; }
uint64_t KvCache::committed_tokens() const { return core_->info(id_).committed; }
ReuseMatch KvCache::reuse_match() const { return core_->reuse_match(id_); }

Status KvCache::resume(Stream stream, const std::vector<CacheGroupId>& optional_groups) {
  if (Status s = core_->resume(id_, optional_groups); !s) return s;
  // The engine's stream waits for the onboarding copies (no stream: the engine waits itself).
  if (stream.handle != 0) core_->backend().stream_wait(stream, ready_event());
  return Status::ok();
}
Status KvCache::can_resume(const std::vector<CacheGroupId>& optional_groups) const {
  return core_->can_resume(id_, optional_groups);
}
Status KvCache::suspend() { return core_->suspend(id_); }
Status KvCache::prefetch() { return core_->prefetch(id_, UINT64_MAX).status(); }
Result<uint64_t> KvCache::pages_away() const { return core_->pages_away(id_); }
Result<uint64_t> KvCache::prefetch(uint64_t max_pages) {
  if (max_pages == 0) return Status::invalid("prefetch: max_pages is 0; at least 1 page");
  return core_->prefetch(id_, max_pages);
}
Status KvCache::set_swa_scratch(bool on) { return core_->set_swa_scratch(id_, on); }
Result<ScratchDesc> KvCache::scratch(CacheGroupId group) const {
  return core_->scratch(id_, group);
}
Status KvCache::resize(uint64_t capacity, uint64_t history) {
  return core_->resize(id_, capacity, history);
}
Status KvCache::close() { return core_->close(id_); }
Status KvCache::commit(std::span<const int32_t> tokens, bool is_end, SnapshotRole role) {
  return core_->commit(id_, tokens, is_end, role);
}
Status KvCache::commit_kv(std::span<const int32_t> tokens) {
  return core_->commit(id_, tokens, false, std::nullopt);
}
Status KvCache::stop_committing() { return core_->stop_committing(id_); }
Result<std::vector<uint64_t>> KvCache::reserve_states(std::span<const uint64_t> points,
                                                      SnapshotRole role) {
  return core_->reserve_states(id_, points, role);
}
Result<std::vector<int32_t>> KvCache::reserved_state_slots(CacheGroupId group) const {
  return core_->reserved_state_slots(id_, group);
}
Result<PlannedDrop> KvCache::plan_snapshot_drop() {
  Result<uint64_t> drop = core_->plan_snapshot_drop(id_);
  if (!drop.is_ok()) return drop.status();
  return PlannedDrop(core_, drop.value());
}

Status PlannedDrop::release() const {
  if (!core_) return Status(StatusCode::kNotFound, "this planned drop names no plan");
  return core_->release_drop(id_);
}
Result<std::span<const int32_t>> KvCache::block_table(CacheGroupId group, uint32_t beam) const {
  return core_->block_table(id_, group, beam);
}
Result<int32_t> KvCache::state_index(CacheGroupId group, uint32_t beam) const {
  return core_->state_index(id_, group, beam);
}
Status KvCache::set_index_buffer(CacheGroupId group, uint32_t beam, std::span<int32_t> buffer) {
  return core_->set_index_buffer(id_, group, beam, buffer);
}
Status KvCache::set_block_priority(uint64_t first_block, uint64_t end_block, int32_t priority) {
  return core_->set_block_priority(id_, first_block, end_block, priority);
}

// --- KvCacheManager ---

namespace {

// Every policy name is one the library has (before anything is built).
Status check_policies(const PolicyConfig& p) {
  if (auto e = storage::find_eviction_policy(p.eviction); !e) return e.status();
  if (auto o = storage::find_offload_policy(p.offload); !o) return o.status();
  if (auto r = cache_detail::find_rebalance_policy(p.rebalance); !r) return r.status();
  return Status::ok();
}

}  // namespace

// This thread's hasher of a kind (probes and hash_prompt run on any thread at once; setting a
// hasher up costs more than hashing a short prompt).
prefix::BlockHasher& thread_hasher(BlockHash kind) {
  thread_local std::unique_ptr<prefix::BlockHasher> hashers[2];
  std::unique_ptr<prefix::BlockHasher>& hasher = hashers[static_cast<size_t>(kind)];
  if (!hasher) hasher = std::make_unique<prefix::BlockHasher>(kind);
  return *hasher;
}

KvCacheManager::KvCacheManager(std::shared_ptr<ManagerCore> core) : core_(std::move(core)) {}
KvCacheManager::~KvCacheManager() = default;

Result<std::unique_ptr<KvCacheManager>> KvCacheManager::create(const ManagerConfig& config,
                                                               const BackendOptions& options) {
  if (Status s = check_policies(config.policies); !s) return s;
  Result<StoragePlan> plan = StoragePlan::build(config);
  if (!plan) return plan.status();
  if (options.kind == BackendKind::kEngine && config.shared.store) {
    return Status::invalid(
        "shared.store: the shared tier reads the pages it publishes into host memory; the "
        "engine backend (BackendKind::kEngine) hands out slot copies only");
  }
  if (options.devices.size() > 1 && config.shared.store) {
    return Status::invalid("shared.store: the shared tier publishes one rank's pages; " +
                           std::to_string(options.devices.size()) +
                           " ranks (devices) in one manager are not supported with it yet");
  }
  Result<std::unique_ptr<memory::MemoryBackend>> backend = memory::make_backend(options);
  if (!backend) return backend.status();
  if (Status s = (*backend)->allocate(*plan); !s) return s;
  auto core = std::make_shared<ManagerCore>(std::move(plan).value(), std::move(backend).value());
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(std::move(core)));
}

const StoragePlan& KvCacheManager::plan() const { return core_->plan(); }

Result<std::unique_ptr<KvCache>> KvCacheManager::create_kv_cache(const CacheOptions& options) {
  return create_kv_cache(CacheOptions(options));
}

Result<std::unique_ptr<KvCache>> KvCacheManager::create_kv_cache(CacheOptions&& options) {
  Result<uint32_t> id = core_->create(std::move(options));
  if (!id) return id.status();
  return std::unique_ptr<KvCache>(new KvCache(core_, *id));
}

ReuseMatch KvCacheManager::probe_reuse(const ReuseScope& scope, std::span<const int32_t> tokens,
                                       std::span<const MultimodalItem> multimodal) const {
  return core_->reads().probe(thread_hasher(core_->plan().config().block_hash), scope, tokens,
                              multimodal);
}

Status KvCacheManager::resize_all(std::span<const CacheResize> resizes) {
  std::vector<ManagerCore::ResizeCall> calls;
  calls.reserve(resizes.size());
  for (size_t i = 0; i < resizes.size(); ++i) {
    const KvCache* c = resizes[i].cache;
    if (c == nullptr || c->core_ != core_) {
      return Status::invalid("resize_all: resizes[" + std::to_string(i) +
                             "]: " + (c == nullptr ? "no cache" : "a cache of another manager"));
    }
    calls.push_back({c->id_, resizes[i].capacity, resizes[i].history});
  }
  return core_->resize_all(calls);
}
void KvCacheManager::clear_reusable_blocks() { core_->memory().clear_reusable_blocks(); }
std::vector<CacheEvent> KvCacheManager::take_events() { return core_->reads().take_events(); }
ReuseStats KvCacheManager::reuse_stats() const { return core_->reads().reuse_stats(); }
ReuseStats KvCacheManager::take_reuse_stats() { return core_->reads().take_reuse_stats(); }
Result<uint64_t> KvCacheManager::quota(TierKind tier) const { return core_->memory().quota(tier); }
bool KvCacheManager::need_adjustment() const { return core_->memory().need_adjustment(); }
Result<bool> KvCacheManager::adjust() { return core_->memory().adjust(); }
Result<uint64_t> KvCacheManager::evict_ahead(std::span<const uint64_t> free_slots,
                                             uint64_t max_evictions) {
  return core_->memory().evict_ahead(free_slots, max_evictions);
}
Result<ReuseMatch> KvCacheManager::touch_reuse(const ReuseScope& scope,
                                               std::span<const int32_t> tokens,
                                               const PromptKeys* keys,
                                               std::span<const MultimodalItem> multimodal) {
  return core_->memory().touch_reuse(scope, tokens, keys, multimodal);
}
Status KvCacheManager::set_quota(TierKind tier, uint64_t quota_bytes) {
  return core_->memory().set_quota(tier, quota_bytes);
}
IterationStats KvCacheManager::take_iteration_stats() {
  return core_->reads().take_iteration_stats();
}
StorageStats KvCacheManager::storage_stats() const { return core_->memory().storage_stats(); }
Result<SharedFetch> KvCacheManager::fetch_shared(const ReuseScope& scope,
                                                 std::span<const int32_t> tokens) {
  return core_->shared().fetch(scope, tokens);
}
std::future<Result<SharedFetch>> KvCacheManager::fetch_shared_async(
    const ReuseScope& scope, std::span<const int32_t> tokens) {
  return core_->shared().fetch_async(scope, std::vector<int32_t>(tokens.begin(), tokens.end()));
}
SharedTierStats KvCacheManager::shared_stats() const { return core_->shared().stats(); }
void KvCacheManager::flush_shared() { core_->shared().flush(); }

uint64_t KvCacheManager::clamp_max_seq_len_for_mem(uint64_t max_seq_len) const {
  const std::optional<uint64_t> longest = core_->plan().max_request_tokens();
  return longest ? std::min(*longest, max_seq_len) : max_seq_len;
}

Result<uint64_t> KvCacheManager::clamp_max_seq_len(uint64_t batch_size,
                                                   uint64_t max_seq_len) const {
  if (batch_size == 0) return Status::invalid("clamp_max_seq_len: batch_size 0 must be > 0");
  const std::optional<uint64_t> longest = core_->plan().max_request_tokens(batch_size);
  return longest ? std::min(*longest, max_seq_len) : max_seq_len;
}

Status KvCacheManager::shutdown() { return core_->memory().shutdown(); }

namespace {

Result<EngineCopyQueue*> engine_queue(memory::MemoryBackend& backend, const char* op) {
  if (backend.kind() != BackendKind::kEngine) {
    return Status(StatusCode::kFailedPrecondition,
                  std::string(op) + ": the manager's backend is '" +
                      backend_kind_name(backend.kind()) +
                      "', which runs its own copies (only 'engine' hands them out)");
  }
  return dynamic_cast<EngineCopyQueue*>(&backend);
}

}  // namespace

Result<std::vector<EngineCopyBatch>> KvCacheManager::take_copies() {
  Result<EngineCopyQueue*> queue = engine_queue(core_->backend(), "take_copies");
  if (!queue) return queue.status();
  return (*queue)->take();
}

Status KvCacheManager::copies_done(CopyEvent event) {
  Result<EngineCopyQueue*> queue = engine_queue(core_->backend(), "copies_done");
  if (!queue) return queue.status();
  return (*queue)->done(event);
}

void KvCacheManager::wait(CopyEvent event) { core_->backend().wait(event); }
void KvCacheManager::stream_wait(Stream stream, CopyEvent event) {
  core_->backend().stream_wait(stream, event);
}
Status KvCacheManager::copy_status() const { return core_->backend().copy_status(); }
BackendKind KvCacheManager::backend_kind() const { return core_->backend().kind(); }
void KvCacheManager::fill(std::span<const std::span<std::byte>> spans, uint8_t value,
                          Stream stream) {
  core_->backend().fill(spans, value, stream);
}
std::vector<uint64_t> KvCacheManager::scan_non_finite(
    std::span<const std::span<const std::byte>> spans, std::span<const DType> dtypes) const {
  return core_->backend().scan_non_finite(spans, dtypes);
}

std::shared_ptr<const PromptKeys> KvCacheManager::hash_prompt(
    const ReuseScope& scope, std::span<const int32_t> tokens,
    std::span<const MultimodalItem> multimodal) const {
  const ManagerConfig& config = core_->plan().config();
  return cache_detail::CoreAccess::make_keys(
      config, scope, tokens, multimodal,
      prefix::prompt_block_keys(thread_hasher(config.block_hash), scope, tokens, multimodal,
                                config.tokens_per_block));
}

uint32_t KvCacheManager::ranks() const { return core_->backend().ranks(); }

std::byte* KvCacheManager::slot_address(TierKind tier, PoolGroupId pool_group, uint32_t pool,
                                        uint32_t slot, uint32_t rank) const {
  std::byte* base = core_->backend().pool_base(tier, pool_group, pool, rank);
  if (base == nullptr) return nullptr;
  return base + static_cast<uint64_t>(slot) * plan().pool_group(pool_group).pools[pool].slot_bytes;
}

}  // namespace hybridkv
