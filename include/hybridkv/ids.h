// Small typed ids. Slots, pages, tree blocks and groups are addressed by dense indices; a typed
// wrapper keeps a CacheGroupId from being passed where a PoolGroupId is expected.
//
// Thread-safety: value types.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace hybridkv {

template <typename Tag>
struct StrongId {
  uint32_t value = UINT32_MAX;

  constexpr StrongId() = default;
  constexpr explicit StrongId(uint32_t v) : value(v) {}
  constexpr bool valid() const { return value != UINT32_MAX; }
  constexpr auto operator<=>(const StrongId&) const = default;
};

struct CacheGroupTag {};
struct PoolGroupTag {};
using CacheGroupId = StrongId<CacheGroupTag>;  // a cache group ("life cycle" in the seeds)
using PoolGroupId = StrongId<PoolGroupTag>;    // cache groups that share one slot allocator

}  // namespace hybridkv

template <typename Tag>
struct std::hash<hybridkv::StrongId<Tag>> {
  size_t operator()(const hybridkv::StrongId<Tag>& id) const noexcept {
    return std::hash<uint32_t>()(id.value);
  }
};
