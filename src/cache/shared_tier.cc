#include "cache/shared_tier.h"

#include <cstdio>
#include <cstring>
#include <sstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hybridkv::cache_detail {

uint64_t layout_fingerprint(const StoragePlan& plan, const std::string& model_id) {
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
  const std::string text = s.str();
  return XXH3_64bits(text.data(), text.size());
}

SharedTier::SharedTier(const StoragePlan& plan, const SharedTierConfig& config)
    : store_(config.store),
      fingerprint_(layout_fingerprint(plan, config.model_id)),
      rank_(config.rank),
      max_queued_(config.max_queued_objects),
      max_lookup_blocks_(config.max_lookup_blocks),
      prefill_tokens_per_s_(config.prefill_tokens_per_s),
      fetch_bytes_per_s_(config.fetch_bytes_per_s),
      writer_([this] { run(); }) {}

SharedTier::~SharedTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  writer_.join();
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

void SharedTier::publish(std::vector<Object> objects) {
  {
    std::lock_guard lock(mu_);
    for (Object& o : objects) {
      if (queue_.size() >= max_queued_) {
        ++stats_.objects_dropped;
        continue;
      }
      queue_.push_back(std::move(o));
    }
  }
  wake_.notify_one();
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

// The publisher: takes up to a batch of objects, writes them in one pipelined call (write-once:
// an object another instance wrote first is left as it is), counts, and repeats.
void SharedTier::run() {
  constexpr size_t kBatch = 32;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    std::vector<Object> batch;
    while (!queue_.empty() && batch.size() < kBatch) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writing_ = true;
    lock.unlock();
    std::vector<std::string> keys;
    std::vector<std::span<const std::byte>> values;
    for (const Object& o : batch) {
      keys.push_back(o.key);
      values.emplace_back(o.bytes);
    }
    const std::vector<StoreOutcome> out = store_->put(keys, values);
    lock.lock();
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] == StoreOutcome::kOk) {
        ++stats_.objects_published;
        stats_.bytes_published += batch[i].bytes.size();
      } else if (out[i] == StoreOutcome::kExists) {
        ++stats_.objects_present;
      } else {
        ++stats_.publish_failures;
      }
    }
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace hybridkv::cache_detail
