// The calls both Python managers (KvCacheManager, HybridCacheManager) expose over their
// KvCacheManager, bound once (manager_calls.cc holds the conversions).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "hybridkv/manager.h"

namespace hybridkv::python {

nanobind::list events_to_python(const std::vector<CacheEvent>& events);
nanobind::list storage_to_python(const StorageStats& stats);
nanobind::dict iteration_stats_to_python(const IterationStats& stats);
nanobind::dict reuse_stats_to_python(const ReuseStats& stats);
nanobind::dict shared_fetch_to_python(const SharedFetch& fetch);
nanobind::dict shared_stats_to_python(const SharedTierStats& stats);
nanobind::list copies_to_python(const std::vector<EngineCopyBatch>& batches);
std::optional<std::string> copy_error(const KvCacheManager& manager);

// What fetch_shared_async returns to Python: the C++ future, polled or waited on.
struct SharedFetchFuture {
  std::shared_future<Result<SharedFetch>> future;
};
void bind_shared_fetch_future(nanobind::module_& m);

// `get(self)` returns the KvCacheManager& (itself thread-safe: no Python-side lock needed).
template <typename Cls, typename Get>
void bind_manager_calls(nanobind::class_<Cls>& cls, Get get) {
  namespace nb = nanobind;
  using namespace nb::literals;
  using Release = nb::call_guard<nb::gil_scoped_release>;
  cls.def(
         "fetch_shared",
         [get](Cls& self, std::vector<int32_t> tokens) {
           Result<SharedFetch> f = [&] {
             nb::gil_scoped_release release;
             return get(self).fetch_shared({}, tokens);
           }();
           return shared_fetch_to_python(value_or_raise(std::move(f)));
         },
         "tokens"_a,
         "Brings the prompt's blocks the local tree lacks from the shared tier (config shared), as "
         "far as the hybrid rule allows; call it before creating the request. A dict "
         "(SharedFetch: local_tokens, hit_tokens, objects_fetched, ...).")
      .def(
          "fetch_shared_async",
          [get](Cls& self, std::vector<int32_t> tokens) {
            nb::gil_scoped_release release;
            return SharedFetchFuture{get(self).fetch_shared_async({}, tokens).share()};
          },
          "tokens"_a,
          "fetch_shared on the shared tier's own thread, as a prefetch: returns a "
          "SharedFetchFuture at once (done(), result()); create the request once it is done.")
      .def(
          "shared_stats",
          [get](Cls& self) { return shared_stats_to_python(get(self).shared_stats()); },
          "The shared tier's counters (SharedTierStats) as a dict.")
      .def(
          "copies_done",
          [get](Cls& self, uint64_t event) { raise_if_error(get(self).copies_done({event})); },
          "event"_a, Release(),
          "BackendKind.ENGINE: the engine ran every copy batch up to `event` (take_copies' "
          "'event').")
      .def(
          "flush_shared", [get](Cls& self) { get(self).flush_shared(); }, Release(),
          "Returns once every committed object queued for the shared tier has been written.")
      .def(
          "take_events",
          [get](Cls& self) {
            std::vector<CacheEvent> events;
            {
              nb::gil_scoped_release release;
              events = get(self).take_events();
            }
            return events_to_python(events);
          },
          "The tree's changes since the last call (ManagerConfig.record_events): dicts with "
          "kind ('stored', 'removed', 'updated'), key and parent_key (hex), tokens, group, tier "
          "and priority.")
      .def(
          "take_iteration_stats",
          [get](Cls& self) {
            IterationStats stats;
            {
              nb::gil_scoped_release release;
              stats = get(self).take_iteration_stats();
            }
            return iteration_stats_to_python(stats);
          },
          "Counters since the previous call (then zero): pages, tier moves, suspends, resumes.")
      .def(
          "reuse_stats",
          [get](Cls& self) {
            ReuseStats stats;
            {
              nb::gil_scoped_release release;
              stats = get(self).reuse_stats();
            }
            return reuse_stats_to_python(stats);
          },
          "Prefix-reuse counters per cache group (hybridkv/reuse.h's GroupReuseStats), pages "
          "served by tier, and the tree size.")
      .def(
          "take_reuse_stats",
          [get](Cls& self) {
            ReuseStats stats;
            {
              nb::gil_scoped_release release;
              stats = get(self).take_reuse_stats();
            }
            return reuse_stats_to_python(stats);
          },
          "reuse_stats(), then the counters restart from zero (per-interval figures).")
      .def(
          "storage_stats",
          [get](Cls& self) {
            StorageStats stats;
            {
              nb::gil_scoped_release release;
              stats = get(self).storage_stats();
            }
            return storage_to_python(stats);
          },
          "Slots per tier and pool group: dicts of tier, pool_group, total_slots, free_slots "
          "and evictable_slots.")
      .def(
          "quota",
          [get](Cls& self, TierKind tier) { return value_or_raise(get(self).quota(tier)); },
          "tier"_a, Release(), "The tier's quota in bytes.")
      .def(
          "set_quota",
          [get](Cls& self, TierKind tier, uint64_t bytes) {
            raise_if_error(get(self).set_quota(tier, bytes));
          },
          "tier"_a, "quota_bytes"_a, Release(),
          "Grows or shrinks a tier while caches live. Refused, changing nothing: ValueError "
          "below the GPU floors, RefusedError beyond the tier's max_quota_bytes, "
          "OutOfPagesError when the pages in use do not fit.")
      .def(
          "copy_error", [get](Cls& self) { return copy_error(get(self)); }, Release(),
          "None, or the first copy that failed (a DISK tier write or read) and which slot.")
      .def(
          "wait", [get](Cls& self, uint64_t event) { get(self).wait(CopyEvent{event}); }, "event"_a,
          Release(), "Blocks until every copy up to the event (a ticket) completed.")
      .def(
          "stream_wait",
          [get](Cls& self, uintptr_t stream, uint64_t event) {
            get(self).stream_wait(Stream{stream}, CopyEvent{event});
          },
          "stream"_a, "event"_a, Release(),
          "Makes a CUDA stream (its handle, e.g. torch.cuda.current_stream().cuda_stream) wait "
          "for the copies up to the event without blocking the host (CUDA backend; others "
          "block).")
      .def(
          "synchronize", [get](Cls& self) { get(self).synchronize(); }, Release(),
          "Blocks until every copy submitted so far has completed (pool views read after it "
          "see them).");
}

}  // namespace hybridkv::python
