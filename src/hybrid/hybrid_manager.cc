#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>

#include "cache/manager_core.h"
#include "hybrid/step_state.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/units.h"

namespace hybridkv {

struct HybridCacheManager::Request {
  std::unique_ptr<KvCache> cache;
  uint64_t prompt_len = 0;  // the prompt's tokens are the cache's first (prompt_of)
  uint64_t divergence = 0;  // its cache's match's divergence_tokens (set when it is created)
  ReuseScope scope;
  bool replay_reset_pending = true;  // its replay page has not been reset yet
  std::vector<uint64_t> demand_points;
  std::vector<uint64_t> chunk_points;  // reserved states of the current chunk
};

namespace {

// The request's prompt, read from its cache's own copy (valid until a commit past the prompt
// appends to it: read before committing an answer).
std::span<const int32_t> prompt_of(const KvCache& cache, uint64_t prompt_len) {
  return cache_detail::CoreAccess::tokens(cache).first(prompt_len);
}

}  // namespace

struct HybridCacheManager::Requests {
  // Node-based: a Request stays where it is while others come and go (lookup hands out
  // pointers). Every call of a step looks its request up here.
  std::unordered_map<uint64_t, Request> by_id;
};

Result<std::unique_ptr<HybridCacheManager>> HybridCacheManager::create(
    const ModelDescription& model, const ServingConfig& serving, const BackendOptions& backend) {
  Result<ManagerConfig> config = hybrid_manager_config(model, serving);
  if (!config) return config.status();
  return create(*config, serving, backend);
}

Result<std::unique_ptr<HybridCacheManager>> HybridCacheManager::create(
    const ManagerConfig& input, const ServingConfig& serving, const BackendOptions& backend) {
  Result<ManagerConfig> config = input;
  // A configuration that cannot hold its own floors is refused, not silently raised: the
  // engine asked for this quota and must know what to change.
  Result<uint64_t> minimum = minimum_gpu_quota(*config);
  if (!minimum) return minimum.status();
  const uint64_t gpu = config->tiers.empty() ? 0 : config->tiers.front().quota_bytes;
  if (gpu < *minimum) {
    const uint64_t active =
        static_cast<uint64_t>(serving.max_batch) * serving.pp_size + serving.dummy_slots;
    return Status::invalid(
        "GPU quota " + format_bytes(gpu) + " cannot hold the floors of this configuration (" +
        format_bytes(*minimum) + ": a state slot for each of " + std::to_string(active) +
        " ACTIVE requests (max_batch x pp_size + dummy_slots) and replay slots for " +
        std::to_string(max_live_caches(serving)) +
        " living caches): raise the GPU quota to at least " + format_bytes(*minimum) +
        ", or lower max_batch, dummy_slots or num_spec_tokens");
  }
  Result<std::unique_ptr<KvCacheManager>> manager = KvCacheManager::create(*config, backend);
  if (!manager) return manager.status();
  std::unique_ptr<HybridCacheManager> h(new HybridCacheManager());
  h->requests_ = std::make_unique<Requests>();
  h->serving_ = serving;
  h->manager_ = std::move(manager).value();
  const StoragePlan& plan = h->manager_->plan();
  for (const SsmLayerConfig& l : config->ssm_layers) {
    // The request's state slot: its SSM state's group (a short convolution has a conv state
    // only, in the same slot).
    const bool has_ssm = std::any_of(l.buffers.begin(), l.buffers.end(), [](const BufferConfig& b) {
      return b.role == "ssm_state" && b.bytes_per_page > 0;
    });
    if (!h->state_group_)
      h->state_group_ = *plan.buffer_group_id(l.id, has_ssm ? "ssm_state" : "conv_state");
    for (const BufferConfig& b : l.buffers) {
      if (b.role.rfind("replay_", 0) == 0 && b.bytes_per_page > 0 && !h->replay_group_) {
        h->replay_group_ = *plan.buffer_group_id(l.id, b.role);
      }
    }
  }
  // Dummies live for the manager's life, ACTIVE, in slots of their own.
  for (uint32_t i = 0; i < serving.dummy_slots; ++i) {
    Result<std::unique_ptr<KvCache>> dummy = h->manager_->create_kv_cache({});
    if (!dummy) return dummy.status();
    if (Status s = (*dummy)->resume({}); !s) return s;
    h->dummies_.push_back(std::move(dummy).value());
    h->dummy_reset_pending_.push_back(true);
  }
  (void)h->manager_->take_iteration_stats();  // dummies are not counted in statistics
  return h;
}

HybridCacheManager::~HybridCacheManager() {
  if (requests_) requests_->by_id.clear();
  dummies_.clear();
}

size_t HybridCacheManager::num_requests() const { return requests_->by_id.size(); }

Status HybridCacheManager::lookup(uint64_t id, Request** out) {
  auto it = requests_->by_id.find(id);
  if (it == requests_->by_id.end())
    return Status::not_found("request " + std::to_string(id) + " is unknown");
  *out = &it->second;
  return Status::ok();
}

KvCache* HybridCacheManager::cache(uint64_t id) {
  auto it = requests_->by_id.find(id);
  return it == requests_->by_id.end() ? nullptr : it->second.cache.get();
}

Status HybridCacheManager::add_request(uint64_t id, std::span<const int32_t> prompt,
                                       ReuseScope scope, std::shared_ptr<const PromptKeys> keys) {
  return add_request(id, std::vector<int32_t>(prompt.begin(), prompt.end()), scope,
                     std::move(keys));
}

Status HybridCacheManager::add_request(uint64_t id, std::vector<int32_t>&& prompt, ReuseScope scope,
                                       std::shared_ptr<const PromptKeys> keys) {
  if (requests_->by_id.count(id)) {
    return Status::invalid("request " + std::to_string(id) + " already exists");
  }
  const uint64_t prompt_len = prompt.size();
  CacheOptions o;
  o.scope = scope;
  o.input_tokens = std::move(prompt);
  o.label = "request " + std::to_string(id);
  o.prompt_keys = std::move(keys);
  Result<std::unique_ptr<KvCache>> cache = manager_->create_kv_cache(std::move(o));
  if (!cache) {
    prompt = std::move(o.input_tokens);  // create_kv_cache left the options whole
    return cache.status();
  }
  Request r;
  r.cache = std::move(cache).value();
  r.prompt_len = prompt_len;
  ReuseMatch match = r.cache->reuse_match();
  r.divergence = match.divergence_tokens;
  r.scope = scope;
  // Demand-driven snapshots: block ends on this prompt's path where attention could have been
  // reused past the last snapshot (marked in the tree by earlier lookups, and this one).
  if (serving_.snapshots.demand_driven) r.demand_points = std::move(match.demand_points);
  requests_->by_id.emplace(id, std::move(r));
  return Status::ok();
}

Status HybridCacheManager::resume(uint64_t id) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  return r->cache->resume({});
}

Status HybridCacheManager::suspend(uint64_t id) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  return r->cache->suspend();  // the replay reset mark stays: suspend keeps replay state
}

Status HybridCacheManager::resize(uint64_t id, uint64_t capacity, uint64_t history) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  return r->cache->resize(capacity, history);
}

Status HybridCacheManager::check_step_ids(const char* op, std::span<const uint64_t> ids) {
  std::map<uint64_t, size_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (auto [it, fresh] = seen.emplace(ids[i], i); !fresh) {
      return Status::invalid(std::string(op) + ": request " + std::to_string(ids[i]) +
                             " appears twice (positions " + std::to_string(it->second) + " and " +
                             std::to_string(i) + "): one row per request");
    }
    Request* r;
    if (Status s = lookup(ids[i], &r); !s)
      return Status(s.code(), std::string(op) + ": " + s.message());
    if (r->cache->state() != CacheState::kActive) {
      return Status(StatusCode::kFailedPrecondition,
                    std::string(op) + ": request " + std::to_string(ids[i]) + " is " +
                        cache_state_name(r->cache->state()) + ", not ACTIVE");
    }
  }
  return Status::ok();
}

Status HybridCacheManager::decode_step(std::span<const uint64_t> request_ids) {
  if (Status s = check_step_ids("decode_step", request_ids); !s) return s;
  std::vector<CacheResize> resizes;
  resizes.reserve(request_ids.size());
  for (uint64_t id : request_ids) {
    KvCache* c = cache(id);
    resizes.push_back({c, c->history() + 1, c->history()});
  }
  return manager_->resize_all(resizes);
}

Status HybridCacheManager::reprefill(uint64_t id) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  CacheOptions o;
  o.scope = r->scope;
  const std::span<const int32_t> prompt = prompt_of(*r->cache, r->prompt_len);
  o.input_tokens.assign(prompt.begin(), prompt.end());
  o.label = "request " + std::to_string(id);
  if (Status s = r->cache->close(); !s) return s;
  r->cache.reset();
  Result<std::unique_ptr<KvCache>> cache = manager_->create_kv_cache(std::move(o));
  if (!cache) {
    requests_->by_id.erase(id);
    return cache.status();
  }
  r->cache = std::move(cache).value();
  r->divergence = r->cache->reuse_match().divergence_tokens;
  r->replay_reset_pending = true;  // the state was dropped: replay starts from reset
  return Status::ok();
}

Status HybridCacheManager::free_request(uint64_t id) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  if (r->cache->state() != CacheState::kClosed) {
    if (Status s = r->cache->close(); !s) return s;
  }
  requests_->by_id.erase(id);
  return Status::ok();
}

// The first snapshot point of the policy after token `after`, or UINT64_MAX (the end of the
// prompt is not included: callers treat it by final_prompt_boundary). The one place the policy
// is evaluated; `kept_only` leaves out the speculative points (periodic ones).
uint64_t HybridCacheManager::next_policy_point(const Request& r, uint64_t after,
                                               bool kept_only) const {
  const SnapshotPolicy& p = serving_.snapshots;
  const uint64_t prompt = r.prompt_len;
  uint64_t next = UINT64_MAX;
  auto consider = [&](uint64_t point) {
    if (point > after && point < next) next = point;
  };
  if (!kept_only && p.periodic_interval && *p.periodic_interval > 0)
    consider((after / *p.periodic_interval + 1) * *p.periodic_interval);
  if (p.aligned_end && *p.aligned_end > 0) consider(prompt / *p.aligned_end * *p.aligned_end);
  for (uint64_t o : p.offsets_from_start) consider(o);
  for (uint64_t o : p.offsets_from_end) {
    if (o < prompt) consider(prompt - o);
  }
  if (p.branch_point) consider(r.divergence);
  for (uint64_t d : r.demand_points) consider(d);
  return next;
}

Result<uint64_t> HybridCacheManager::next_snapshot_point(uint64_t id) const {
  auto it = requests_->by_id.find(id);
  if (it == requests_->by_id.end())
    return Status::not_found("request " + std::to_string(id) + " is unknown");
  const Request& r = it->second;
  const uint64_t history = r.cache->history();
  // At the latest, the end of the prompt; periodic points end no chunk when the kernel writes
  // their states inside it.
  const uint64_t next = std::min<uint64_t>(
      next_policy_point(r, history, serving_.snapshots.chunk_states), r.prompt_len);
  return std::max(next, history);
}

Result<uint64_t> HybridCacheManager::evict_ahead(uint64_t step_tokens) {
  // Attention pages only: a step allocates a block per attention group every tokens_per_block
  // tokens. Snapshots freed ahead were measured to cost reuse (bench/RESULTS.md, 2026-12-05).
  const StoragePlan& plan = manager_->plan();
  const uint64_t tpb = plan.config().tokens_per_block;
  std::vector<uint64_t> free(plan.pool_groups().size(), 0);
  for (const CacheGroup& g : plan.cache_groups()) {
    if (g.kind == GroupKind::kAttention) free[g.pool_group.value] += (step_tokens + tpb - 1) / tpb;
  }
  uint64_t most = 0;
  for (const PoolGroup& pg : plan.pool_groups()) {
    uint64_t& f = free[pg.id.value];
    f = std::min(f, plan.slots(TierKind::kGpu, pg.id) / 8);
    most += f;
  }
  return manager_->evict_ahead(free, most);
}

Status HybridCacheManager::commit_at_snapshot(uint64_t id) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  const uint64_t history = r->cache->history();
  const uint64_t committed = r->cache->committed_tokens();
  if (history <= committed || history > r->prompt_len) return Status::ok();
  // Without recurrent layers there is no state to place: the prompt's end publishes its tail.
  const bool end = history == r->prompt_len;
  const bool point = (end && (!state_group_ || serving_.snapshots.final_prompt_boundary)) ||
                     next_policy_point(*r, history - 1) == history;
  const std::span<const int32_t> prompt =
      prompt_of(*r->cache, r->prompt_len);  // commits below do not pass its end
  uint64_t from = committed;
  for (uint64_t at : r->chunk_points) {  // the states the kernel wrote inside the chunk
    if (at <= from || at >= history) continue;
    const Status s =
        r->cache->commit(prompt.subspan(from, at - from), false, SnapshotRole::kSpeculative);
    if (!s.is_ok() && s.code() != StatusCode::kOutOfPages) return s;
    from = r->cache->committed_tokens();
  }
  r->chunk_points.clear();
  const std::span<const int32_t> tokens = prompt.subspan(from, history - from);
  if (!point) return r->cache->commit_kv(tokens);
  return r->cache->commit(tokens, false, snapshot_role(*r, history));
}

Result<std::vector<ChunkState>> HybridCacheManager::reserve_chunk_states(uint64_t id,
                                                                         uint64_t upto) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  std::vector<ChunkState> out;
  const uint64_t history = r->cache->history();
  if (!serving_.snapshots.chunk_states || !state_group_ || upto > r->prompt_len) return out;
  std::vector<uint64_t> points;
  for (uint64_t at = next_policy_point(*r, history); at < upto; at = next_policy_point(*r, at)) {
    if (at % serving_.tokens_per_block == 0 && snapshot_role(*r, at) == SnapshotRole::kSpeculative)
      points.push_back(at);
  }
  Result<std::vector<uint64_t>> reserved = r->cache->reserve_states(points);
  if (!reserved) return reserved.status();
  r->chunk_points = *reserved;
  const std::vector<int32_t> slots = *r->cache->reserved_state_slots(*state_group_);
  for (size_t i = 0; i < slots.size(); ++i) out.push_back({r->chunk_points[i], slots[i]});
  return out;
}

// Speculative (SnapshotRole): a periodic point that no other rule of the policy places, and the
// end of a prompt that aligned_end placed a point inside of (the end is then the second guess
// of where a continuation's match ends: kept while memory is not short).
SnapshotRole HybridCacheManager::snapshot_role(const Request& r, uint64_t at) const {
  const SnapshotPolicy& p = serving_.snapshots;
  const uint64_t prompt = r.prompt_len;
  if (at == prompt) {
    const uint64_t aligned =
        p.aligned_end && *p.aligned_end > 0 ? prompt / *p.aligned_end * *p.aligned_end : 0;
    return aligned > 0 && aligned < prompt ? SnapshotRole::kSpeculative : SnapshotRole::kKept;
  }
  return next_policy_point(r, at - 1, /*kept_only=*/true) == at ? SnapshotRole::kKept
                                                                : SnapshotRole::kSpeculative;
}

Status HybridCacheManager::commit_answer(uint64_t id, std::span<const int32_t> generated) {
  Request* r;
  if (Status s = lookup(id, &r); !s) return s;
  const uint64_t history = r->cache->history();
  const uint64_t committed = r->cache->committed_tokens();
  const uint64_t prompt = r->prompt_len;
  const std::string what = "commit_answer(request " + std::to_string(id) + ")";
  if (history < prompt) {
    return Status(StatusCode::kFailedPrecondition, what + ": the prompt is computed up to " +
                                                       std::to_string(history) + " of " +
                                                       std::to_string(prompt) + " tokens");
  }
  if (generated.size() < history - prompt) {
    return Status::invalid(what + ": " + std::to_string(generated.size()) +
                           " generated tokens, but the cache computed " +
                           std::to_string(history - prompt));
  }
  if (history <= committed) return Status::ok();
  const std::span<const int32_t> prompt_tokens =
      prompt_of(*r->cache, r->prompt_len);  // read before the commit
  std::vector<int32_t> tokens;
  tokens.reserve(history - committed);
  for (uint64_t i = committed; i < history; ++i)
    tokens.push_back(i < prompt ? prompt_tokens[i] : generated[i - prompt]);
  return r->cache->commit(tokens);
}

Result<HybridCacheManager::Step> HybridCacheManager::prepare_step(
    std::span<const uint64_t> request_ids, uint32_t num_dummies) {
  if (num_dummies > dummies_.size()) {
    return Status::invalid("prepare_step: " + std::to_string(num_dummies) + " dummies but only " +
                           std::to_string(dummies_.size()) + " dummy_slots");
  }
  if (Status s = check_step_ids("prepare_step", request_ids); !s) return s;
  Step step;
  auto indices = [&](const KvCache& cache, StepEntry& e) {
    if (state_group_) e.state_index = *cache.state_index(*state_group_);
    e.replay_index = replay_group_ ? *cache.state_index(*replay_group_) : e.state_index;
  };
  for (uint64_t id : request_ids) {
    StepEntry e;
    e.request_id = id;
    indices(*cache(id), e);
    step.entries.push_back(e);
  }
  // Only now that the whole step is valid are the reset marks consumed.
  for (size_t i = 0; i < request_ids.size(); ++i) {
    Request& r = requests_->by_id.at(request_ids[i]);
    if (r.replay_reset_pending && replay_group_ && step.entries[i].replay_index != kBadPageIndex) {
      step.replay_resets.push_back(step.entries[i].replay_index);
      r.replay_reset_pending = false;
    }
  }
  for (uint32_t i = 0; i < num_dummies; ++i) {
    StepEntry e;
    indices(*dummies_[i], e);
    if (dummy_reset_pending_[i] && replay_group_) {
      step.replay_resets.push_back(e.replay_index);
      dummy_reset_pending_[i] = false;
    }
    step.entries.push_back(e);
  }
  if (manager_->backend_kind() == BackendKind::kEngine) step.copies = *manager_->take_copies();
  return step;
}

std::vector<NonFiniteReport> HybridCacheManager::scan_non_finite(
    std::optional<uint64_t> request_id) const {
  const StoragePlan& plan = manager_->plan();
  // Every (page, buffer) of every cache scanned, then one batched scan over them all.
  std::vector<std::span<const std::byte>> spans;
  std::vector<DType> dtypes;
  std::vector<NonFiniteReport> where;
  auto add_cache = [&](const KvCache& cache, uint64_t id) {
    if (cache.state() != CacheState::kActive) return;
    manager_->wait(cache.ready_event());
    for (const CacheGroup& g : plan.cache_groups()) {
      std::vector<int32_t> slots;
      for (uint32_t beam = 0; beam < cache.beam_width(); ++beam) {
        if (g.kind == GroupKind::kSsm) {
          slots.push_back(*cache.state_index(g.id, beam));
        } else {
          const auto t = cache.block_table(g.id, beam);
          slots.insert(slots.end(), t->begin(), t->end());
        }
      }
      for (uint32_t bi : g.buffers) {
        const PlannedBuffer& b = plan.buffers()[bi];
        if (!b.dtype) continue;
        for (int32_t slot : slots) {
          if (slot == kBadPageIndex) continue;
          for (uint32_t rank = 0; rank < manager_->ranks(); ++rank) {
            const std::byte* base = manager_->slot_address(TierKind::kGpu, b.pool_group, b.pool,
                                                           static_cast<uint32_t>(slot), rank);
            if (base == nullptr) return;  // the none backend has no bytes
            spans.emplace_back(base + b.offset, b.size);
            dtypes.push_back(*b.dtype);
            where.push_back({b.layer, b.role, static_cast<uint32_t>(slot), 0, id, rank});
          }
        }
      }
    }
  };
  std::vector<uint64_t> ids;  // reported in request order
  for (const auto& entry : requests_->by_id) {
    if (!request_id || *request_id == entry.first) ids.push_back(entry.first);
  }
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) add_cache(*requests_->by_id.at(id).cache, id);
  const std::vector<uint64_t> first = manager_->scan_non_finite(spans, dtypes);
  std::vector<NonFiniteReport> out;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] == UINT64_MAX) continue;
    out.push_back(where[i]);
    out.back().element = first[i];  // one report per page and buffer
  }
  return out;
}

void HybridCacheManager::reset_replay(const Step& step, Stream stream, uint32_t rank) {
  if (!replay_group_ || step.replay_resets.empty()) return;
  const StoragePlan& plan = manager_->plan();
  std::vector<std::span<std::byte>> spans;
  for (uint32_t bi : plan.cache_group(*replay_group_).buffers) {
    const PlannedBuffer& b = plan.buffers()[bi];
    if (b.role.rfind("replay_", 0) != 0) continue;
    for (int32_t slot : step.replay_resets) {
      std::byte* base = manager_->slot_address(TierKind::kGpu, b.pool_group, b.pool,
                                               static_cast<uint32_t>(slot), rank);
      if (base == nullptr) return;  // the none backend has no bytes (or no such rank)
      spans.emplace_back(base + b.offset, b.size);
    }
  }
  manager_->fill(spans, 0, stream);
}

}  // namespace hybridkv
