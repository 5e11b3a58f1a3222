#include "cache/shared_tier.h"

#include <cstdio>
#include <cstring>
#include <sstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hybridkv::cache_detail {

uint64_t layout_fingerprint(const StoragePlan& plan, const std::string& model_id, bool modelled) {
  std::ostringstream s;  // (not string concatenation: g++ 12 at -O3 warns on it, -Wrestrict)
  s << "model " << model_id << " tpb " << plan.config().tokens_per_block;
  for (const CacheGroup& g : plan.cache_groups()) {
    s << " | group " << g.id.value << " kind " << static_cast<int>(g.kind) << " policy "
      << static_cast<int>(g.policy) << " window " << g.window.value_or(0) << " layers";
    for (LayerId l : g.layers) s << " " << l;
  }
  for (const PoolGroup& pg : plan.pool_groups()) {
    s << " | pool group " << pg.id.value;
    for (const Pool& p : pg.pools) s << " " << p.buffer_size << "x" << p.num_buffers;
  }
  if (plan.config().snapshot_dtype)
    s << " | snapshots " << static_cast<int>(*plan.config().snapshot_dtype);
  if (modelled) s << " | modelled";
  const std::string text = s.str();
  return XXH3_64bits(text.data(), text.size());
}

SharedTier::SharedTier(const StoragePlan& plan, const SharedTierConfig& config,
                       memory::MemoryBackend& backend)
    : store_(config.store),
      backend_(backend),
      modelled_(backend.kind() == BackendKind::kNone),
      fingerprint_(layout_fingerprint(plan, config.model_id, modelled_)),
      rank_(config.rank),
      max_queued_(config.max_queued_objects),
      max_queued_bytes_(config.max_queued_bytes),
      max_lookup_blocks_(config.max_lookup_blocks),
      prefill_tokens_per_s_(config.prefill_tokens_per_s),
      fetch_bytes_per_s_(config.fetch_bytes_per_s),
      writer_([this] { run(); }),
      fetcher_([this] { run_fetches(); }) {}

SharedTier::~SharedTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  fetch_wake_.notify_all();
  fetcher_.join();  // the fetch under way finishes; the others are answered
  writer_.join();
}

std::future<Result<SharedFetch>> SharedTier::run_fetch(std::function<Result<SharedFetch>()> fetch) {
  Fetch f{std::move(fetch), {}};
  std::future<Result<SharedFetch>> done = f.done.get_future();
  {
    std::lock_guard lock(mu_);
    fetches_.push_back(std::move(f));
  }
  fetch_wake_.notify_one();
  return done;
}

void SharedTier::run_fetches() {
  std::unique_lock lock(mu_);
  for (;;) {
    fetch_wake_.wait(lock, [&] { return stop_ || !fetches_.empty(); });
    if (stop_) break;
    Fetch f = std::move(fetches_.front());
    fetches_.pop_front();
    lock.unlock();
    f.done.set_value(f.run());
    lock.lock();
  }
  for (Fetch& f : fetches_) {
    f.done.set_value(Status(StatusCode::kFailedPrecondition,
                            "fetch_shared_async: the manager was destroyed before the fetch ran"));
  }
  fetches_.clear();
}

std::string SharedTier::key(SharedObjectKind kind, CacheGroupId group,
                            const BlockKey& chain) const {
  uint64_t digest = 0;
  std::memcpy(&digest, chain.data(), sizeof digest);
  return shared_object_key(fingerprint_, rank_, kind, group.value, digest);
}

SharedObjectHeader SharedTier::header(SharedObjectKind kind,
                                      std::span<const int32_t> tokens) const {
  return {kind, fingerprint_, XXH3_64bits(tokens.data(), tokens.size_bytes())};
}

std::optional<SharedTier::Object> SharedTier::object(std::string key,
                                                     const SharedObjectHeader& header,
                                                     uint64_t page_bytes) {
  const size_t bytes =
      kSharedObjectHeaderBytes + payload_bytes(page_bytes) + kSharedObjectTrailerBytes;
  memory::HostBuffer buffer;
  {
    std::lock_guard lock(mu_);
    if (taken_objects_ >= max_queued_ || taken_bytes_ + bytes > max_queued_bytes_) {
      ++stats_.objects_dropped;
      return std::nullopt;
    }
    ++taken_objects_;
    taken_bytes_ += bytes;
    auto it = spare_.find(bytes);
    if (it != spare_.end() && !it->second.empty()) {
      buffer = std::move(it->second.back());
      it->second.pop_back();
      spare_bytes_ -= bytes;
    }
  }
  if (!buffer) buffer = backend_.host_buffer(bytes);
  return Object{std::move(key), header, std::move(buffer), bytes, page_bytes};
}

void SharedTier::publish(CopyEvent ready, std::vector<Object> objects) {
  {
    std::lock_guard lock(mu_);
    for (Object& o : objects) queue_.push_back({ready, std::move(o)});
  }
  wake_.notify_one();
}

void SharedTier::recycle(memory::HostBuffer buffer, size_t bytes) {
  constexpr uint64_t kSpareBytes = 256ull << 20;
  if (spare_bytes_ + bytes > kSpareBytes) return;  // freed here
  spare_[bytes].push_back(std::move(buffer));
  spare_bytes_ += bytes;
}

void SharedTier::drain() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

SharedTierStats SharedTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void SharedTier::count_fetch(const SharedFetch& f) {
  std::lock_guard lock(mu_);
  ++stats_.fetches;
  stats_.hit_tokens += f.hit_tokens - f.local_tokens;
  stats_.objects_fetched += f.objects_fetched;
  stats_.bytes_fetched += f.bytes_fetched;
  stats_.objects_corrupt += f.objects_corrupt;
  stats_.store_failures += f.store_failures;
  stats_.fetches_skipped += f.skipped ? 1 : 0;
}

bool SharedTier::slower_than_recomputing(uint64_t bytes, uint64_t tokens) const {
  if (prefill_tokens_per_s_ <= 0) return false;
  return static_cast<double>(bytes) / fetch_bytes_per_s_ >
         static_cast<double>(tokens) / prefill_tokens_per_s_;
}

// The publisher: takes up to a batch of objects, waits for the copies that fill them, seals
// them, writes them in one pipelined call (write-once: an object another instance wrote first is
// left as it is), counts, and repeats.
void SharedTier::run() {
  constexpr size_t kBatch = 32;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    std::vector<Queued> batch;
    while (!queue_.empty() && batch.size() < kBatch) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writing_ = true;
    lock.unlock();
    write(batch);
    lock.lock();
    for (Queued& q : batch) {
      --taken_objects_;
      taken_bytes_ -= q.object.bytes;
      recycle(std::move(q.object.buffer), q.object.bytes);
    }
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

// Requires: mu_ not held. Counts under mu_.
void SharedTier::write(std::vector<Queued>& batch) {
  CopyEvent latest;
  for (const Queued& q : batch) {
    if (q.ready.ticket > latest.ticket) latest = q.ready;
  }
  backend_.wait(latest);  // memory-to-memory copies: they do not fail
  std::vector<std::string> keys;
  std::vector<std::span<const std::byte>> values;
  for (Queued& q : batch) {
    const std::span<std::byte> bytes(q.object.buffer.get(), q.object.bytes);
    seal_shared_object(q.object.header, bytes);
    keys.push_back(q.object.key);
    values.emplace_back(bytes);
  }
  const std::vector<StoreOutcome> out = store_->put(keys, values);
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const StoreOutcome o = out[i];
    if (o == StoreOutcome::kOk) {
      ++stats_.objects_published;
      stats_.bytes_published += batch[i].object.page_bytes;
    } else if (o == StoreOutcome::kExists) {
      ++stats_.objects_present;
    } else {
      ++stats_.publish_failures;
    }
  }
}

}  // namespace hybridkv::cache_detail
