// The calls that both Python managers expose over a KvCacheManager: events, storage and copy
// state, quotas, copy events and the engine's stream, pool fills and NaN/Inf scans. One home for
// the conversions to Python values (dicts, lists, hex keys).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "dicts.h"
#include "hybridkv/manager.h"
#include "manager_calls.h"

#include <chrono>

namespace nb = nanobind;

namespace hybridkv::python {
namespace {

std::string hex(const BlockKey& key) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : key) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

const char* event_kind(CacheEventKind kind) {
  switch (kind) {
    case CacheEventKind::kStored:
      return "stored";
    case CacheEventKind::kRemoved:
      return "removed";
    case CacheEventKind::kUpdated:
      return "updated";
  }
  return "?";
}

}  // namespace

nb::list events_to_python(const std::vector<CacheEvent>& events) {
  nb::list out;
  for (const CacheEvent& e : events) {
    nb::dict d;
    d["kind"] = event_kind(e.kind);
    d["key"] = hex(e.key);
    d["parent_key"] = hex(e.parent_key);
    d["tokens"] = e.tokens;
    d["group"] = e.group.value;
    d["tier"] = e.tier;
    d["priority"] = e.priority;
    out.append(d);
  }
  return out;
}

nb::list storage_to_python(const StorageStats& stats) {
  nb::list out;
  for (const TierStorage& t : stats.tiers) {
    for (const PoolGroupStorage& pg : t.pool_groups) {
      nb::dict d;
      d["tier"] = t.tier;
      d["pool_group"] = pg.pool_group.value;
      d["total_slots"] = pg.total_slots;
      d["free_slots"] = pg.free_slots;
      d["evictable_slots"] = pg.evictable_slots;
      out.append(d);
    }
  }
  return out;
}

nb::dict iteration_stats_to_python(const IterationStats& s) { return to_py(s); }

nb::dict reuse_stats_to_python(const ReuseStats& s) { return to_py(s); }
nb::dict shared_fetch_to_python(const SharedFetch& f) { return to_py(f); }
nb::dict shared_stats_to_python(const SharedTierStats& s) { return to_py(s); }
nb::list copies_to_python(const std::vector<EngineCopyBatch>& batches) { return to_py(batches); }

void bind_shared_fetch_future(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<SharedFetchFuture>(m, "SharedFetchFuture",
                                "A fetch_shared_async under way: done() polls, result() waits.")
      .def(
          "done",
          [](SharedFetchFuture& f) {
            return f.future.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
          },
          "Whether the fetch has finished (result() then returns at once).")
      .def(
          "result",
          [](SharedFetchFuture& f) {
            Result<SharedFetch> r = [&] {
              nb::gil_scoped_release release;
              return f.future.get();
            }();
            return shared_fetch_to_python(value_or_raise(std::move(r)));
          },
          "Waits for the fetch (the GIL released) and returns fetch_shared's dict, or raises "
          "its error (each call the same).");
}

std::optional<std::string> copy_error(const KvCacheManager& m) {
  const Status s = m.copy_status();
  if (s) return std::nullopt;
  return s.to_string();
}

}  // namespace hybridkv::python
