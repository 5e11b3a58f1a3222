// The calls that both Python managers expose over a KvCacheManager: events, storage and copy
// state, quotas, copy events and the engine's stream, pool fills and NaN/Inf scans. One home for
// the conversions to Python values (dicts, lists, hex keys).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "hybridkv/manager.h"

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

nb::dict iteration_stats_to_python(const IterationStats& s) {
  nb::dict d;
  d["pages_allocated"] = s.pages_allocated;
  d["pages_onboarded"] = s.pages_onboarded;
  d["bytes_onboarded"] = s.bytes_onboarded;
  d["pages_offloaded"] = s.pages_offloaded;
  d["bytes_offloaded"] = s.bytes_offloaded;
  d["device_copies"] = s.device_copies;
  d["pages_dropped"] = s.pages_dropped;
  d["pages_offload_cancelled"] = s.pages_offload_cancelled;
  d["bytes_offload_cancelled"] = s.bytes_offload_cancelled;
  d["bytes_copies_kept"] = s.bytes_copies_kept;
  d["pages_returned_to_copy"] = s.pages_returned_to_copy;
  d["bytes_returned_to_copy"] = s.bytes_returned_to_copy;
  d["suspends"] = s.suspends;
  d["resumes"] = s.resumes;
  d["refused_resumes"] = s.refused_resumes;
  nb::list groups;  // by cache group id
  for (const GroupIterationStats& g : s.groups) {
    nb::dict gd;
    gd["reused_blocks"] = g.reused_blocks;
    gd["new_blocks"] = g.new_blocks;
    gd["evicted_blocks"] = g.evicted_blocks;
    gd["onboarded_blocks"] = g.onboarded_blocks;
    gd["onboarded_bytes"] = g.onboarded_bytes;
    gd["offloaded_blocks"] = g.offloaded_blocks;
    gd["offloaded_bytes"] = g.offloaded_bytes;
    gd["device_copy_blocks"] = g.device_copy_blocks;
    gd["device_copy_bytes"] = g.device_copy_bytes;
    groups.append(gd);
  }
  d["groups"] = groups;
  nb::list tiers;  // by tier index: moves into (offloads) and out of (onboards) each tier
  for (const TierIterationStats& t : s.tiers) {
    nb::dict td;
    td["offloaded_bytes"] = t.offloaded_bytes;
    td["offload_cancelled_bytes"] = t.offload_cancelled_bytes;
    td["onboarded_bytes"] = t.onboarded_bytes;
    td["returned_to_copy_bytes"] = t.returned_to_copy_bytes;
    tiers.append(td);
  }
  d["tiers"] = tiers;
  return d;
}

nb::dict reuse_stats_to_python(const ReuseStats& s) {
  auto by_tier = [](const std::array<uint64_t, 3>& a) {
    nb::list l;
    for (uint64_t v : a) l.append(v);
    return l;
  };
  nb::list groups;
  for (const GroupReuseStats& g : s.groups) {
    nb::dict d;
    d["lookups"] = g.lookups;
    d["hits"] = g.hits;
    d["misses"] = g.misses;
    d["reused_tokens"] = g.reused_tokens;
    d["unreused_tokens"] = g.unreused_tokens;
    d["aligned_snapshot_hits"] = g.aligned_snapshot_hits;
    d["unaligned_snapshot_hits"] = g.unaligned_snapshot_hits;
    d["snapshots_stored"] = g.snapshots_stored;
    d["snapshots_removed"] = g.snapshots_removed;
    d["orphans_dropped"] = g.orphans_dropped;
    d["served_by_tier"] = by_tier(g.served_by_tier);
    groups.append(d);
  }
  nb::dict out;
  out["groups"] = groups;
  out["pages_served_by_tier"] = by_tier(s.pages_served_by_tier);
  out["tree_blocks"] = s.tree_blocks;
  return out;
}

std::optional<std::string> copy_error(const KvCacheManager& m) {
  const Status s = m.copy_status();
  if (s) return std::nullopt;
  return s.to_string();
}

}  // namespace hybridkv::python
