// The general manager: ManagerConfig (layers and buffers as declared by an engine), KvCacheManager
// and the per-request KvCache. A KvCache may outlive its manager (they share its state). Every
// call that takes the manager's lock releases the GIL; the C++ objects are thread-safe.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <optional>

#include "arrays.h"
#include "bindings.h"
#include "hybridkv/manager.h"
#include "manager_calls.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace hybridkv::python {
namespace {

using Release = nb::call_guard<nb::gil_scoped_release>;

void bind_layer_configs(nb::module_& m) {
  nb::enum_<SnapshotRole>(m, "SnapshotRole")
      .value("KEPT", SnapshotRole::kKept)
      .value("SPECULATIVE", SnapshotRole::kSpeculative);
  nb::enum_<ReusePolicy>(m, "ReusePolicy")
      .value("REQUIRED", ReusePolicy::kRequired)
      .value("OPTIONAL", ReusePolicy::kOptional)
      .value("PRIVATE", ReusePolicy::kPrivate);
  nb::class_<BufferConfig> buffer(m, "BufferConfig", "One buffer of a layer, bytes per page.");
  kw_init(buffer);
  buffer.def_rw("role", &BufferConfig::role)
      .def_rw("bytes_per_page", &BufferConfig::bytes_per_page)
      .def_rw("reuse_policy", &BufferConfig::reuse_policy)
      .def_rw("dtype", &BufferConfig::dtype);
  nb::class_<AttentionLayerConfig> attention(m, "AttentionLayerConfig",
                                             "An attention layer (full or sliding window).");
  kw_init(attention);
  attention.def_rw("id", &AttentionLayerConfig::id)
      .def_rw("window", &AttentionLayerConfig::window)
      .def_rw("sink_tokens", &AttentionLayerConfig::sink_tokens)
      .def_rw("reuse_policy", &AttentionLayerConfig::reuse_policy)
      .def_rw("buffers", &AttentionLayerConfig::buffers);
  nb::class_<SsmLayerConfig> ssm(m, "SsmLayerConfig", "A recurrent layer's state buffers.");
  kw_init(ssm);
  ssm.def_rw("id", &SsmLayerConfig::id)
      .def_rw("reuse_policy", &SsmLayerConfig::reuse_policy)
      .def_rw("buffers", &SsmLayerConfig::buffers);
  nb::enum_<BlockHash>(m, "BlockHash")
      .value("SHA256", BlockHash::kSha256)
      .value("FAST_NON_CRYPTOGRAPHIC", BlockHash::kFastNonCryptographic);
  nb::class_<RequestShape> shape(m, "RequestShape",
                                 "One request of a batch shape: capacity and history tokens.");
  kw_init(shape);
  shape.def_rw("capacity", &RequestShape::capacity).def_rw("history", &RequestShape::history);
  nb::class_<BatchShape> batch(m, "BatchShape",
                               "Requests that run in one step (and a shared system prompt).");
  kw_init(batch);
  batch.def_rw("requests", &BatchShape::requests)
      .def_rw("shared_prefix_tokens", &BatchShape::shared_prefix_tokens);
  nb::class_<ManagerConfig> config(m, "ManagerConfig", "Layers, tiers and knobs (config.h).");
  kw_init(config);
  config.def_rw("tokens_per_block", &ManagerConfig::tokens_per_block)
      .def_rw("attention_layers", &ManagerConfig::attention_layers)
      .def_rw("ssm_layers", &ManagerConfig::ssm_layers)
      .def_rw("tiers", &ManagerConfig::tiers)
      .def_rw("max_util_for_resume", &ManagerConfig::max_util_for_resume)
      .def_rw("max_live_kv_caches", &ManagerConfig::max_live_kv_caches)
      .def_rw("enable_block_reuse", &ManagerConfig::enable_block_reuse)
      .def_rw("commit_min_snapshot", &ManagerConfig::commit_min_snapshot)
      .def_rw("enable_partial_reuse", &ManagerConfig::enable_partial_reuse)
      .def_rw("policies", &ManagerConfig::policies)
      .def_rw("snapshot_dtype", &ManagerConfig::snapshot_dtype)
      .def_rw("pool_ratio", &ManagerConfig::pool_ratio)
      .def_rw("record_events", &ManagerConfig::record_events)
      .def_rw("reuse_match_backoff", &ManagerConfig::reuse_match_backoff)
      .def_rw("block_hash", &ManagerConfig::block_hash)
      .def_rw("swa_scratch_reuse", &ManagerConfig::swa_scratch_reuse)
      .def_rw("max_rewind_len", &ManagerConfig::max_rewind_len)
      .def_rw("typical_step", &ManagerConfig::typical_step)
      .def_rw("constraints", &ManagerConfig::constraints)
      .def_rw("shared", &ManagerConfig::shared);
}

// The shared tier: an opaque store handle (open_redis_store) and its config.
void bind_shared_tier(nb::module_& m) {
  nb::class_<SharedStore>(m, "SharedStore", "A store shared by serving instances (shared_store.h).")
      .def(
          "ping", [](SharedStore& s) { raise_if_error(s.ping()); }, Release(),
          "Raises when the store does not answer (the message names the address).");
  m.def(
      "open_redis_store",
      [](const std::string& host, uint16_t port, bool cluster,
         uint32_t timeout_ms) -> std::shared_ptr<SharedStore> {
#ifdef HKV_PY_HAVE_REDIS
        RedisStoreConfig c;
        c.host = host;
        c.port = port;
        c.cluster = cluster;
        c.timeout = std::chrono::milliseconds(timeout_ms);
        return std::shared_ptr<SharedStore>(value_or_raise(open_redis_store(c)).release());
#else
        (void)host, (void)port, (void)cluster, (void)timeout_ms;
        raise_if_error(Status(StatusCode::kFailedPrecondition,
                              "open_redis_store: built without hiredis (libhiredis-dev)"));
        return nullptr;
#endif
      },
      "host"_a = "127.0.0.1", "port"_a = 6379, "cluster"_a = false, "timeout_ms"_a = 250,
      "A Redis server (or, with cluster, a Redis Cluster node) as the shared tier's store; it "
      "need not be up yet (calls miss until it is).");
  nb::class_<SharedTierConfig> shared(m, "SharedTierConfig", "The shared tier (config.h).");
  kw_init(shared);
  shared.def_rw("store", &SharedTierConfig::store)
      .def_rw("model_id", &SharedTierConfig::model_id)
      .def_rw("rank", &SharedTierConfig::rank)
      .def_rw("max_queued_objects", &SharedTierConfig::max_queued_objects)
      .def_rw("max_queued_bytes", &SharedTierConfig::max_queued_bytes)
      .def_rw("max_lookup_blocks", &SharedTierConfig::max_lookup_blocks)
      .def_rw("prefill_tokens_per_s", &SharedTierConfig::prefill_tokens_per_s)
      .def_rw("fetch_bytes_per_s", &SharedTierConfig::fetch_bytes_per_s);
}

std::vector<int32_t> table_copy(const KvCache& c, uint32_t group, uint32_t beam) {
  std::span<const int32_t> t;
  {
    nb::gil_scoped_release release;
    Result<std::span<const int32_t>> r = c.block_table(CacheGroupId(group), beam);
    raise_if_error(r.status());
    t = *r;
  }
  return {t.begin(), t.end()};
}

// The cache writes its block table into the engine's array on every change (zero copy for the
// engine); the array is kept alive by the cache object (keep_alive) until detached or closed.
// Only the caller's own int32 memory is taken: a converted temporary would be written instead.
void set_index_buffer(KvCache& c, uint32_t group, uint32_t beam, nb::handle buf) {
  std::span<int32_t> span;
  if (!buf.is_none()) span = writable_int32(buf, "set_index_buffer: buffer");
  nb::gil_scoped_release release;
  raise_if_error(c.set_index_buffer(CacheGroupId(group), beam, span));
}

void bind_cache(nb::module_& m) {
  nb::class_<KvCache>(m, "KvCache", "One request's cache (kv_cache.h); closes when collected.")
      .def_prop_ro("state", &KvCache::state)
      .def_prop_ro("capacity", &KvCache::capacity)
      .def_prop_ro("history", &KvCache::history)
      .def_prop_ro("committed_tokens", &KvCache::committed_tokens)
      .def_prop_ro("reused_tokens", [](const KvCache& c) { return c.reuse_match().reused_tokens; })
      .def(
          "resume", [](KvCache& c, uintptr_t stream) { raise_if_error(c.resume(Stream{stream})); },
          "stream"_a = 0, Release(),
          "SUSPENDED -> ACTIVE (RefusedError at the gate, OutOfPagesError without room). With a "
          "CUDA stream handle the stream waits for the onboarding copies (cuda backend).")
      .def_prop_ro(
          "ready_event", [](const KvCache& c) { return c.ready_event().ticket; },
          "The copy event (a ticket) the engine waits on before touching the pages.")
      .def(
          "prefetch",
          [](KvCache& c, std::optional<uint64_t> max_pages) -> uint64_t {
            if (!max_pages) {
              raise_if_error(c.prefetch());
              return 0;
            }
            return value_or_raise(c.prefetch(*max_pages));
          },
          "max_pages"_a = nb::none(), Release(),
          "Starts onboarding a SUSPENDED cache's pages so that resume only waits. With max_pages: "
          "at most that many, answering how many (fewer: none is left away), to spread a long "
          "prefix over steps; without: all of them (answers 0).")
      .def_prop_ro(
          "pages_away", [](const KvCache& c) { return value_or_raise(c.pages_away()); },
          "How many of a SUSPENDED cache's pages sit on a colder tier now: resume it in a step "
          "once few are left, prefetch the rest between steps.")
      .def(
          "plan_snapshot_drop", [](KvCache& c) { return value_or_raise(c.plan_snapshot_drop()); },
          Release(), "A PlannedDrop of the snapshots this cache would leave in the tree.")
      .def(
          "suspend", [](KvCache& c) { raise_if_error(c.suspend()); }, Release())
      .def(
          "resize",
          [](KvCache& c, uint64_t capacity, uint64_t history) {
            raise_if_error(c.resize(capacity, history));
          },
          "capacity"_a, "history"_a, Release())
      .def(
          "commit",
          [](KvCache& c, std::vector<int32_t> tokens, bool is_end, SnapshotRole role) {
            nb::gil_scoped_release release;
            raise_if_error(c.commit(tokens, is_end, role));
          },
          "tokens"_a, "is_end"_a = false, "role"_a = SnapshotRole::kKept,
          "Publishes tokens [committed, committed + len); role SPECULATIVE: a snapshot at a point "
          "no request is known to resume from (published demoted, superseding nothing).")
      .def(
          "reserve_states",
          [](KvCache& c, std::vector<uint64_t> points, SnapshotRole role) {
            nb::gil_scoped_release release;
            return value_or_raise(c.reserve_states(points, role));
          },
          "points"_a, "role"_a = SnapshotRole::kSpeculative,
          "GPU pages for the states a chunked kernel writes inside the coming chunk, one per SSM "
          "group and point (multiples of tokens_per_block in (history, capacity]); returns the "
          "points reserved (SPECULATIVE: those that cost no page of value; KEPT: all or "
          "OutOfPagesError). A commit ending at a reserved point publishes its state.")
      .def(
          "reserved_state_slots",
          [](const KvCache& c, uint32_t group) {
            return value_or_raise(c.reserved_state_slots(CacheGroupId(group)));
          },
          "group"_a,
          "The GPU slots of the reserved states of an SSM group, in point order (valid until "
          "the next reserve_states, commit, suspend or close, or the manager's adjust()).")
      .def(
          "commit_kv",
          [](KvCache& c, std::vector<int32_t> tokens) {
            nb::gil_scoped_release release;
            raise_if_error(c.commit_kv(tokens));
          },
          "tokens"_a, "Publishes the KV of full blocks only (no snapshot).")
      .def(
          "close", [](KvCache& c) { raise_if_error(c.close()); }, Release())
      .def("block_table", &table_copy, "group"_a, "beam"_a = 0, "A copy of the block table.")
      .def("set_index_buffer", &set_index_buffer, "group"_a, "beam"_a, "buffer"_a.none(),
           nb::keep_alive<1, 4>(),
           "An int32 numpy array the cache keeps equal to its block table (padded with -1) on "
           "every change; None detaches it.")
      .def(
          "state_index",
          [](const KvCache& c, uint32_t group, uint32_t beam) {
            return value_or_raise(c.state_index(CacheGroupId(group), beam));
          },
          "group"_a, "beam"_a = 0, "The SSM slot of a recurrent group (for kernels).");
}

void bind_kv_cache_manager(nb::module_& m) {
  nb::class_<PlannedDrop>(m, "PlannedDrop", "A planned snapshot drop (kv_cache.h).")
      .def_prop_ro("id", &PlannedDrop::id)
      .def(
          "release", [](const PlannedDrop& d) { raise_if_error(d.release()); }, Release(),
          "Runs the plan (KeyError when it was released before).");
  nb::class_<KvCacheManager> cls(m, "KvCacheManager", "The general manager (manager.h).");
  bind_manager_calls(cls, [](KvCacheManager& mgr) -> KvCacheManager& { return mgr; });
  cls.def_static(
         "create",
         [](const ManagerConfig& config, BackendKind backend, int device,
            std::vector<int> devices) {
           BackendOptions o{backend, device};
           o.devices = std::move(devices);
           return value_or_raise(KvCacheManager::create(config, o));
         },
         "config"_a, "backend"_a = BackendKind::kHost, "device"_a = 0,
         "devices"_a = std::vector<int>{},
         "devices: one tensor-parallel rank per entry, each on that CUDA device (HOST: ranks in "
         "host memory); every copy runs on each rank, one set of tables for all.")
      .def(
          "create_kv_cache",
          [](KvCacheManager& mgr, std::vector<int32_t> input_tokens, uint32_t beam_width) {
            CacheOptions o;
            o.input_tokens = std::move(input_tokens);
            o.beam_width = beam_width;
            nb::gil_scoped_release release;
            return value_or_raise(mgr.create_kv_cache(o));
          },
          "input_tokens"_a = std::vector<int32_t>{}, "beam_width"_a = 1,
          "A new SUSPENDED cache holding what the prefix tree offers for the prompt.")
      .def(
          "probe_reuse",
          [](const KvCacheManager& mgr, std::vector<int32_t> tokens) {
            nb::gil_scoped_release release;
            return mgr.probe_reuse({}, tokens).reused_tokens;
          },
          "tokens"_a, "Tokens a cache created for this prompt would reuse (changes nothing).")
      .def(
          "touch_reuse",
          [](KvCacheManager& mgr, std::vector<int32_t> tokens) {
            nb::gil_scoped_release release;
            return value_or_raise(mgr.touch_reuse({}, tokens)).reused_tokens;
          },
          "tokens"_a,
          "A request waits in the engine's queue: the tree pages a cache for this prompt would "
          "reuse become the most recently used in their eviction queues (no reference taken, "
          "nothing counted). Returns the tokens it would reuse.")
      .def(
          "take_copies",
          [](KvCacheManager& mgr) {
            std::vector<EngineCopyBatch> batches;
            {
              nb::gil_scoped_release release;
              batches = value_or_raise(mgr.take_copies());
            }
            return copies_to_python(batches);
          },
          "BackendKind.ENGINE: the copy batches submitted since the last take, oldest first: "
          "dicts (event, lists of {src_tier, dst_tier, src_pool_group, dst_pool_group, "
          "slot_bytes, src_slots, dst_slots}); run the lists in order, then copies_done(event).")
      .def("need_adjustment", &KvCacheManager::need_adjustment, Release())
      .def(
          "adjust", [](KvCacheManager& mgr) { return value_or_raise(mgr.adjust()); }, Release())
      .def(
          "evict_ahead",
          [](KvCacheManager& mgr, std::vector<uint64_t> free_slots, uint64_t max_evictions) {
            return value_or_raise(mgr.evict_ahead(free_slots, max_evictions));
          },
          "free_slots"_a, "max_evictions"_a, Release(),
          "Evicts until GPU pool group g has free_slots[g] free slots, max_evictions pages went "
          "or nothing is left to evict; returns the pages evicted. Call it while the GPU "
          "computes a step.")
      .def_prop_ro("ranks", &KvCacheManager::ranks)
      .def_prop_ro("num_cache_groups",
                   [](const KvCacheManager& mgr) { return mgr.plan().cache_groups().size(); });
}

}  // namespace

void bind_kv_cache(nb::module_& m) {
  bind_shared_tier(m);
  bind_layer_configs(m);
  bind_cache(m);
  bind_kv_cache_manager(m);
}

}  // namespace hybridkv::python
