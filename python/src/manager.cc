// The hybrid manager: requests, snapshots, the per-step index handoff (one batched call, its
// indices written into buffers the manager owns and numpy views over them), pool views and
// statistics.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <utility>

#include "arrays.h"
#include "bindings.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/testing/inspect.h"
#include "manager_calls.h"
#include "py_manager.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace hybridkv::python {
namespace {

std::vector<int32_t> copy_table(Manager& m, uint64_t id, uint32_t group, uint32_t beam) {
  std::vector<int32_t> out;
  m.on_request(id, [&](HybridCacheManager&, KvCache& c) -> Status {
    Result<std::span<const int32_t>> t = c.block_table(CacheGroupId(group), beam);
    if (!t) return t.status();
    out.assign(t->begin(), t->end());
    return Status::ok();
  });
  return out;
}

// The GPU slot of a request's recurrent state in `group` (default: the state group).
int32_t state_index(Manager& m, uint64_t id, std::optional<uint32_t> group, uint32_t beam) {
  int32_t out = kBadPageIndex;
  m.on_request(id, [&](HybridCacheManager& h, KvCache& c) -> Status {
    const std::optional<CacheGroupId> g =
        group ? std::optional<CacheGroupId>(CacheGroupId(*group)) : h.state_group();
    if (!g) return Status::invalid("state_index: the model has no state group");
    Result<int32_t> index = c.state_index(*g, beam);
    if (!index) return index.status();
    out = *index;
    return Status::ok();
  });
  return out;
}

// Pool memory as an array that keeps the manager alive: numpy where the CPU can address it; a
// DLPack array on the CUDA device for the CUDA backend's GPU tier (torch.from_dlpack takes it).
nb::object pool_array(Manager& m, nb::handle owner, TierKind tier, std::byte* at,
                      const size_t shape[2], const int64_t strides[2], nb::dlpack::dtype dtype,
                      uint32_t rank) {
  if (tier == TierKind::kGpu && m.backend_kind() == BackendKind::kCuda) {
    return nb::cast(nb::ndarray<>(at, 2, shape, owner, strides, dtype, nb::device::cuda::value,
                                  m.device(rank)));
  }
  return nb::cast(nb::ndarray<nb::numpy>(at, 2, shape, owner, strides, dtype));
}

// A whole pool of one tier as an array [slots, slot bytes] over the backend's memory (None for
// the none backend, which holds no bytes).
nb::object pool_view(nb::handle self, TierKind tier, uint32_t pool_group, uint32_t pool,
                     uint32_t rank) {
  Manager& m = nb::cast<Manager&>(self);
  m.check_rank(rank, "pool_view");
  const StoragePlan& plan = m.h().plan();
  if (pool_group >= plan.pool_groups().size())
    throw nb::value_error(("pool_view: no pool group " + std::to_string(pool_group)).c_str());
  const PoolGroup& pg = plan.pool_group(PoolGroupId(pool_group));
  if (pool >= pg.pools.size())
    throw nb::value_error(("pool_view: pool group " + std::to_string(pool_group) + " has no pool " +
                           std::to_string(pool))
                              .c_str());
  const TierPlan* t = plan.tier(tier);
  if (t == nullptr) throw nb::value_error("pool_view: the tier is not configured");
  std::byte* base = m.slot_address(tier, PoolGroupId(pool_group), pool, 0, rank);
  if (base == nullptr) return nb::none();
  const size_t shape[2] = {t->reserved_slots[pool_group], pg.pools[pool].slot_bytes};
  const int64_t strides[2] = {static_cast<int64_t>(pg.pools[pool].slot_bytes), 1};
  return pool_array(m, self, tier, base, shape, strides, nb::dtype<uint8_t>(), rank);
}

// The element type numpy shows for a buffer dtype (bf16 and fp8 as raw integers of their width).
nb::dlpack::dtype numpy_dtype(std::optional<DType> dtype) {
  switch (dtype.value_or(DType::kUINT8)) {
    case DType::kF32:
      return nb::dtype<float>();
    case DType::kF16:
      return nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kBF16:
      return nb::dtype<uint16_t>();
    case DType::kINT8:
      return nb::dtype<int8_t>();
    default:
      return nb::dtype<uint8_t>();
  }
}

// One buffer of one layer across every slot of a tier: a numpy array [slots, elements] with the
// pool's slot as the row stride, over the manager's memory (None for the none backend). The
// SSM state of request r is row state_index(r) of its "ssm_state" buffer.
nb::object buffer_view(nb::handle self, TierKind tier, uint32_t layer, const std::string& role,
                       uint32_t rank) {
  Manager& m = nb::cast<Manager&>(self);
  m.check_rank(rank, "buffer_view");
  const StoragePlan& plan = m.h().plan();
  const PlannedBuffer& b = *value_or_raise(plan.find_buffer(LayerId(layer), role));
  const TierPlan* t = plan.tier(tier);
  if (t == nullptr) throw nb::value_error("buffer_view: the tier is not configured");
  std::byte* base = m.slot_address(tier, b.pool_group, b.pool, 0, rank);
  if (base == nullptr) return nb::none();
  const uint64_t element = b.dtype ? dtype_size(*b.dtype) : 1;
  const uint64_t slot_bytes = plan.pool_group(b.pool_group).pools[b.pool].slot_bytes;
  const size_t shape[2] = {t->reserved_slots[b.pool_group.value], b.size / element};
  const int64_t strides[2] = {static_cast<int64_t>(slot_bytes / element), 1};
  return pool_array(m, self, tier, base + b.offset, shape, strides, numpy_dtype(b.dtype), rank);
}

// The step buffers (HybridCacheManager::step_buffers) as arrays over their fixed memory that
// keep the manager alive: numpy on the host, DLPack on the GPU with the cuda backend (a CUDA
// graph can capture kernels that read them). State and replay indices [capacity], block tables
// [capacity, table groups, max_blocks].
nb::tuple step_buffers(nb::handle self, uint32_t rank) {
  Manager& m = nb::cast<Manager&>(self);
  m.check_rank(rank, "step_buffers");
  const HybridCacheManager::StepBuffers* v =
      value_or_raise(m.locked([&](HybridCacheManager& h) { return h.step_buffers(rank); }));
  auto array = [&](const int32_t* at, size_t ndim, const size_t* shape) -> nb::object {
    auto* p = const_cast<int32_t*>(at);
    if (v->on_device)
      return nb::cast(nb::ndarray<int32_t>(p, ndim, shape, self, nullptr, nb::dtype<int32_t>(),
                                           nb::device::cuda::value, m.device(rank)));
    return nb::cast(nb::ndarray<nb::numpy, int32_t>(p, ndim, shape, self));
  };
  const size_t flat[1] = {v->capacity};
  const size_t tables[3] = {v->capacity, v->table_groups.size(), v->max_blocks};
  nb::list groups;
  for (CacheGroupId g : v->table_groups) groups.append(g.value);
  return nb::make_tuple(array(v->state_indices, 1, flat), array(v->replay_indices, 1, flat),
                        array(v->block_tables, 3, tables), groups);
}

// Requests: their lifecycle, snapshots and what the manager knows of each.
void bind_requests(nb::class_<Manager>& cls) {
  cls.def(nb::init<const ModelDescription&, const ServingConfig&, BackendKind, int,
                   std::vector<int>>(),
          "model"_a, "serving"_a, "backend"_a = BackendKind::kHost, "device"_a = 0,
          "devices"_a = std::vector<int>{},
          "devices: one tensor-parallel rank per entry, each rank's pools on that CUDA device "
          "(HOST: ranks in host memory); one set of tables for all ranks. Empty: one rank on "
          "`device`.")
      .def_prop_ro("ranks", &Manager::ranks, "Tensor-parallel ranks whose pools it holds.")
      .def(
          "add_request",
          [](Manager& m, uint64_t id, std::vector<int32_t> prompt) {
            m.call([&](HybridCacheManager& h) { return h.add_request(id, std::move(prompt)); });
          },
          "request_id"_a, "prompt"_a, "A new request, SUSPENDED, holding what the tree offers.")
      .def(
          "resume", [](Manager& m, uint64_t id) { m.call([&](auto& h) { return h.resume(id); }); },
          "request_id"_a,
          "Makes a SUSPENDED request ACTIVE (pages back on the GPU; RefusedError at the resume "
          "gate, OutOfPagesError without room).")
      .def(
          "suspend",
          [](Manager& m, uint64_t id) { m.call([&](auto& h) { return h.suspend(id); }); },
          "request_id"_a,
          "Makes an ACTIVE request SUSPENDED: its pages stay, and may move to a colder tier.")
      .def(
          "resize",
          [](Manager& m, uint64_t id, uint64_t capacity, uint64_t history) {
            m.call([&](auto& h) { return h.resize(id, capacity, history); });
          },
          "request_id"_a, "capacity"_a, "history"_a,
          "Tokens the next step computes up to (capacity) and tokens computed (history); "
          "OutOfPagesError changes nothing.")
      .def(
          "reprefill",
          [](Manager& m, uint64_t id) { m.call([&](auto& h) { return h.reprefill(id); }); },
          "request_id"_a,
          "The request comes back as a context request: state dropped, matched against the tree "
          "again.")
      .def(
          "free_request",
          [](Manager& m, uint64_t id) { m.call([&](auto& h) { return h.free_request(id); }); },
          "request_id"_a,
          "Frees everything the request holds; committed pages stay in the prefix tree.")
      .def(
          "request",
          [](Manager& m, uint64_t id) {
            nb::dict d;
            uint64_t history = 0, capacity = 0, reused = 0;
            CacheState state = CacheState::kClosed;
            m.on_request(id, [&](HybridCacheManager&, KvCache& c) -> Status {
              history = c.history();
              capacity = c.capacity();
              reused = c.reuse_match().reused_tokens;
              state = c.state();
              return Status::ok();
            });
            d["history"] = history;
            d["capacity"] = capacity;
            d["reused_tokens"] = reused;
            d["state"] = state;
            return d;
          },
          "request_id"_a, "history, capacity, reused tokens and state of a request");
}

// The per-step handoff, memory views, statistics and rebalancing.
void bind_steps(nb::class_<Manager>& cls) {
  cls.def("buffer_view", &buffer_view, "tier"_a, "layer"_a, "role"_a, "rank"_a = 0,
          "One buffer of one layer as a numpy array [slots, elements] over the manager's memory "
          "(rank `rank`'s; row = slot index; bf16 shows as uint16).");
  cls.def("state_index", &state_index, "request_id"_a, "group"_a = nb::none(), "beam"_a = 0,
          "The GPU slot of an ACTIVE request's recurrent state (row of buffer_view's "
          "'ssm_state' / 'conv_state'); `group` defaults to the state group.")
      .def(
          "buffer_group",
          [](Manager& m, uint32_t layer, const std::string& role) {
            return value_or_raise(m.h().plan().buffer_group_id(LayerId(layer), role)).value;
          },
          "layer"_a, "role"_a, "The cache group that holds one buffer (its block tables).");
  cls.def("block_table", &copy_table, "request_id"_a, "group"_a, "beam"_a = 0,
          "A copy of the request's block table for a cache group (per-step handoff: decode_step).")
      .def(
          "decode_step",
          [](Manager& m, nb::handle ids, std::optional<uint32_t> group) {
            return m.decode_step(request_ids(ids, "decode_step: request_ids"), group);
          },
          "request_ids"_a, "group"_a = nb::none(),
          "One decode step for a batch, all or nothing: every request grows by one token. "
          "request_ids: a 1-D uint64 array or a list of ints, each request once and ACTIVE "
          "(else an error naming the request, and nothing changed). Returns numpy arrays of "
          "this step (state indices, replay indices, block tables of `group` [requests, "
          "blocks], -1 past a request's blocks) that own their memory: later steps leave them "
          "as they are.")
      .def("step_buffers", &step_buffers, "rank"_a = 0,
           "Rank `rank`'s copy of the step's index buffers at fixed addresses, sized once for "
           "max_batch + dummy_slots "
           "entries and max_seq_len / tokens_per_block blocks: (state indices, replay indices, "
           "block tables [entries, table groups, max_blocks], the table groups). On the GPU with "
           "the cuda backend (DLPack capsules, each consumed once by torch.from_dlpack; a CUDA "
           "graph can capture kernels that read them), numpy "
           "otherwise. fill_step() rewrites them; -1 marks what is not in use.")
      .def(
          "fill_step",
          [](Manager& m, nb::handle ids, uint32_t dummies, uintptr_t stream,
             std::vector<uintptr_t> streams) {
            return m.fill_step(request_ids(ids, "fill_step: request_ids"), dummies, stream,
                               streams);
          },
          "request_ids"_a, "num_dummies"_a = 0, "stream"_a = 0,
          "streams"_a = std::vector<uintptr_t>{},
          "Writes one step (every request ACTIVE, listed once; then num_dummies dummies) into "
          "every rank's step_buffers() with one copy each, ordered on `stream` (a cudaStream_t "
          "as an int; 0: the default stream) or on streams[rank] (one per rank). Returns the "
          "replay indices to reset before the step.")
      .def("pool_view", &pool_view, "tier"_a, "pool_group"_a, "pool"_a = 0, "rank"_a = 0,
           "A pool of one tier as a numpy array [slots, slot bytes] over rank `rank`'s memory.")
      .def_prop_ro("state_group",
                   [](Manager& m) -> std::optional<uint32_t> {
                     const auto g = m.h().state_group();
                     return g ? std::optional<uint32_t>(g->value) : std::nullopt;
                   })
      .def_prop_ro(
          "num_requests", [](Manager& m) { return m.h().num_requests(); }, "Requests alive.")
      .def(
          "take_copies",
          [](Manager& m) { return copies_to_python(value_or_raise(m.take_copies())); },
          "BackendKind.ENGINE: the copy batches the steps handed out and those queued since, "
          "oldest first (KvCacheManager.take_copies); run them before the step's kernels, then "
          "copies_done(event).")
      .def_prop_ro("replay_resets", &Manager::replay_resets,
                   "Replay indices the engine resets before running the last decode_step.")
      .def(
          "need_adjustment",
          [](Manager& m) {
            return m.locked([](HybridCacheManager& h) { return h.manager().need_adjustment(); });
          },
          "Whether a rebalancing step would move slots between pool groups now.")
      .def(
          "adjust",
          [](Manager& m) {
            return value_or_raise(
                m.locked([](HybridCacheManager& h) { return h.manager().adjust(); }));
          },
          "Takes one rebalancing step (ServingConfig.policies.rebalance); returns whether slots "
          "moved.")
      .def(
          "evict_ahead",
          [](Manager& m, uint64_t step_tokens) {
            return value_or_raise(
                m.locked([&](HybridCacheManager& h) { return h.evict_ahead(step_tokens); }));
          },
          "step_tokens"_a,
          "Frees GPU slots for step_tokens new tokens in every attention group (at most 1/8 of "
          "a pool group) while the GPU computes a step, so the next step's allocations find them "
          "free; returns the pages evicted (moved down a tier or dropped, as an allocation "
          "would).")
      .def(
          "touch_reuse",
          [](Manager& m, std::vector<int32_t> prompt) {
            return value_or_raise(m.locked([&](HybridCacheManager& h) {
                     return h.manager().touch_reuse({}, prompt);
                   }))
                .reused_tokens;
          },
          "prompt"_a,
          "A request waits in the engine's queue: the tree pages its prompt would reuse become "
          "the most recently used in their eviction queues (no reference taken, nothing "
          "counted), so the requests admitted before it do not evict them first. Returns the "
          "tokens it would reuse.");
}

void bind_diagnostics(nb::class_<Manager>& cls) {
  cls.def(
         "reset_replay",
         [](Manager& m, uintptr_t stream, uint32_t rank) {
           m.check_rank(rank, "reset_replay");
           HybridCacheManager::Step step;
           step.replay_resets = m.replay_resets();
           m.locked([&](HybridCacheManager& h) { h.reset_replay(step, Stream{stream}, rank); });
         },
         "stream"_a = 0, "rank"_a = 0,
         "Zeroes rank `rank`'s replay buffers of the last decode_step's replay_resets (one "
         "batched kernel on the CUDA stream with the cuda backend); once per rank.")
      .def(
          "scan_non_finite",
          [](Manager& m, std::optional<uint64_t> request_id) {
            std::vector<NonFiniteReport> reports;
            m.call([&](HybridCacheManager& h) {
              if (request_id && h.cache(*request_id) == nullptr) {
                return Status::not_found("scan_non_finite: request " + std::to_string(*request_id) +
                                         " is unknown");
              }
              reports = h.scan_non_finite(request_id);
              return Status::ok();
            });
            nb::list out;
            for (const NonFiniteReport& r : reports) {
              nb::dict d;
              d["layer"] = r.layer;
              d["role"] = r.role;
              d["slot"] = r.slot;
              d["element"] = r.element;
              d["request_id"] = r.request_id;
              out.append(d);
            }
            return out;
          },
          "request_id"_a = nb::none(),
          "NaN/Inf by declared dtype in one request's pages, or every living cache's: dicts of "
          "layer, role, slot, element and request_id.");
  bind_manager_calls(cls, [](Manager& m) -> KvCacheManager& { return m.h().manager(); });
}

}  // namespace

void bind_manager(nb::module_& m) {
  nb::class_<Manager> cls(m, "HybridCacheManager",
                          "Requests of a hybrid model on one rank (hybridkv/hybrid.h).");
  bind_requests(cls);
  bind_snapshots(cls);
  bind_steps(cls);
  bind_diagnostics(cls);
  // The testing library's checks, for the fuzzers of python/tests (not the product's API).
  nb::module_ t = m.def_submodule("testing", "hybridkv_testing's checks (tests only).");
  t.def(
      "check_invariants",
      [](Manager& mgr) {
        return mgr.locked(
            [](HybridCacheManager& h) { return testing::check_invariants(h.manager()); });
      },
      "manager"_a, "Every invariant of DESIGN §9: empty when all hold, else the first broken one.");
  t.def(
      "debug_snapshot",
      [](Manager& mgr) {
        return mgr.locked(
            [](HybridCacheManager& h) { return testing::debug_snapshot(h.manager()); });
      },
      "manager"_a, "The whole metadata state, for before/after equality around a refused call.");
}

}  // namespace hybridkv::python
