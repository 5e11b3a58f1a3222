// A small hybrid model for lifecycle tests: one SSM layer (state, conv, and a PRIVATE replay
// row), one full-attention layer and one sliding-window layer, with a fake engine to drive it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "hybridkv/manager.h"
#include "hybridkv/testing/fake_engine.h"
#include "hybridkv/testing/inspect.h"
#include "test_backend.h"

#define ASSERT_OK(expr)                                         \
  do {                                                          \
    const ::hybridkv::Status _s = (expr);                       \
    ASSERT_TRUE(_s.is_ok()) << #expr << ": " << _s.to_string(); \
  } while (0)

#define EXPECT_OK(expr)                                         \
  do {                                                          \
    const ::hybridkv::Status _s = (expr);                       \
    EXPECT_TRUE(_s.is_ok()) << #expr << ": " << _s.to_string(); \
  } while (0)

namespace hybridkv::testing {

struct LifecycleModel {
  uint32_t tokens_per_block = 16;
  uint64_t kv_bytes = 4096;  // per page, key and value each
  uint32_t window = 48;      // 0: no sliding-window layer
  uint64_t gpu_quota = 2ull << 20;
  uint64_t host_quota = 4ull << 20;
  uint64_t gpu_max_quota = 0;  // TierConfig::max_quota_bytes of the GPU tier
  bool private_replay = true;
  std::optional<uint32_t> max_live;
  std::optional<std::vector<double>> pool_ratio;
  bool optional_attention = false;  // adds layer 3: full attention, OPTIONAL
  bool commit_min_snapshot = true;
  bool partial_reuse = false;
  uint32_t backoff = 0;
  bool record_events = false;
  bool block_reuse = true;
  bool swa_scratch = false;  // ManagerConfig::swa_scratch_reuse
  int64_t max_rewind_len = 0;
  bool pool_rebalance = false;          // policies.rebalance "pressure" (else "off")
  bool snapshot_pricing = true;         // policies.eviction "priced" (else "snapshot-aware")
  bool upkeep_between_steps = false;    // policies.upkeep_between_steps
  std::optional<DType> snapshot_dtype;  // ManagerConfig::snapshot_dtype
  uint64_t disk_quota = 0;              // a DISK tier under disk_path when set
  std::string disk_path;
};

inline ManagerConfig lifecycle_config(const LifecycleModel& m) {
  ManagerConfig c;
  c.tokens_per_block = m.tokens_per_block;
  SsmLayerConfig ssm;
  ssm.id = 0;
  ssm.buffers = {{"ssm_state", 16384, {}, DType::kF32}, {"conv_state", 4096, {}, DType::kBF16}};
  if (m.private_replay) ssm.buffers.push_back({"replay_row", 256, ReusePolicy::kPrivate, {}});
  c.ssm_layers.push_back(ssm);
  AttentionLayerConfig full;
  full.id = 1;
  full.buffers = {{"key", m.kv_bytes, {}, {}}, {"value", m.kv_bytes, {}, {}}};
  AttentionLayerConfig window = full;
  window.id = 2;
  window.window = m.window;
  c.attention_layers = {full};
  if (m.window) c.attention_layers.push_back(window);
  if (m.optional_attention) {
    AttentionLayerConfig optional = full;
    optional.id = 3;
    optional.reuse_policy = ReusePolicy::kOptional;
    c.attention_layers.push_back(optional);
  }
  c.commit_min_snapshot = m.commit_min_snapshot;
  c.enable_partial_reuse = m.partial_reuse;
  c.reuse_match_backoff = m.backoff;
  c.record_events = m.record_events;
  c.enable_block_reuse = m.block_reuse;
  c.swa_scratch_reuse = m.swa_scratch;
  c.max_rewind_len = m.max_rewind_len;
  c.policies.rebalance = m.pool_rebalance ? "pressure" : "off";
  c.policies.eviction = m.snapshot_pricing ? "priced" : "snapshot-aware";
  c.policies.upkeep_between_steps = m.upkeep_between_steps;
  c.snapshot_dtype = m.snapshot_dtype;
  c.tiers.push_back({TierKind::kGpu, m.gpu_quota, ""});
  c.tiers.back().max_quota_bytes = m.gpu_max_quota;
  if (m.host_quota) c.tiers.push_back({TierKind::kHost, m.host_quota, ""});
  if (m.disk_quota) c.tiers.push_back({TierKind::kDisk, m.disk_quota, m.disk_path});
  c.max_live_kv_caches = m.max_live;
  c.pool_ratio = m.pool_ratio;
  c.typical_step = BatchShape{std::vector<RequestShape>(4, {512, 511}), {}};
  return c;
}

inline std::unique_ptr<KvCacheManager> make_manager(const LifecycleModel& m,
                                                    BackendOptions backend = test_backend()) {
  Result<std::unique_ptr<KvCacheManager>> manager =
      KvCacheManager::create(lifecycle_config(m), backend);
  EXPECT_TRUE(manager.is_ok()) << manager.status().to_string();
  return manager.is_ok() ? std::move(manager).value() : nullptr;
}

inline std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 50000);
  return t;
}

// One request: its cache and the engine's view of it.
struct Request {
  std::unique_ptr<KvCache> cache;
  testing::FakeRequest fake;
  std::vector<int32_t> slots_at_suspend;
  bool state_only = false;  // capacity 0 for its whole life: it holds only state slots
};

inline Request make_request(KvCacheManager& manager, std::vector<int32_t> tokens, size_t prompt_len,
                            uint32_t beams = 1, ReuseScope scope = {}) {
  Request r;
  CacheOptions o;
  o.scope = scope;
  r.fake.scope = scope;
  o.input_tokens.assign(tokens.begin(), tokens.begin() + static_cast<int64_t>(prompt_len));
  o.beam_width = beams;
  Result<std::unique_ptr<KvCache>> cache = manager.create_kv_cache(o);
  EXPECT_TRUE(cache.is_ok()) << cache.status().to_string();
  if (cache.is_ok()) r.cache = std::move(cache).value();
  r.fake.tokens.assign(beams, tokens);
  if (r.cache) testing::FakeEngine::adopt_reuse(*r.cache, r.fake);
  for (uint32_t b = 1; b < beams; ++b) {
    for (size_t i = prompt_len; i < tokens.size(); ++i)
      r.fake.tokens[b][i] += static_cast<int32_t>(b);
  }
  return r;
}

// Commits everything computed and not yet committed.
inline Status commit_computed(Request& r, bool is_end = false,
                              SnapshotRole role = SnapshotRole::kKept) {
  // The cache learns what was computed at the next resize; commits stop at its history.
  if (r.cache->history() < r.fake.computed) {
    if (Status s = r.cache->resize(r.cache->capacity(), r.fake.computed); !s) return s;
  }
  const uint64_t from = r.cache->committed_tokens(), to = r.fake.computed;
  std::span<const int32_t> all(r.fake.tokens[0]);
  return r.cache->commit(all.subspan(from, to - from), is_end, role);
}

// Grows the cache to `upto` tokens and computes them with the fake engine.
inline Status advance(testing::FakeEngine& engine, Request& r, uint64_t upto);

// Resumes a new request, computes its first `upto` tokens and commits them.
inline Status resume_compute_commit(testing::FakeEngine& engine, Request& r, uint64_t upto) {
  if (Status s = r.cache->resume({}); !s) return s;
  if (Status s = advance(engine, r, upto); !s) return s;
  return commit_computed(r);
}

// Grows the cache to `upto` tokens and computes them with the fake engine.
inline Status advance(testing::FakeEngine& engine, Request& r, uint64_t upto) {
  if (Status s = r.cache->resize(upto, r.fake.computed); !s) return s;
  return engine.step(*r.cache, r.fake, upto);
}

}  // namespace hybridkv::testing
