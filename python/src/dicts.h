// Result structs as Python dicts, every field: the per-struct code is generated at build from
// the headers' field lists (python/struct_fields.py -> struct_dicts.inc), so a field added in
// C++ appears in Python without a second edit. Scalars stay scalars; vectors and arrays become
// lists; nested result structs become dicts.
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <type_traits>
#include <vector>

#include "hybridkv/engine_memory.h"
#include "hybridkv/reuse.h"
#include "hybridkv/shared_store.h"
#include "hybridkv/stats.h"

namespace hybridkv::python {

template <typename T>
requires std::is_arithmetic_v<T> T to_py(T value) { return value; }

inline nanobind::object to_py(TierKind kind) { return nanobind::cast(kind); }
inline uint32_t to_py(PoolGroupId id) { return id.value; }
inline uint64_t to_py(CopyEvent event) { return event.ticket; }

template <typename T>
nanobind::list to_py(const std::vector<T>& values);
template <typename T, size_t N>
nanobind::list to_py(const std::array<T, N>& values);

#include "struct_dicts.inc"

template <typename T>
nanobind::list to_py(const std::vector<T>& values) {
  nanobind::list out;
  for (const T& v : values) out.append(to_py(v));
  return out;
}

template <typename T, size_t N>
nanobind::list to_py(const std::array<T, N>& values) {
  nanobind::list out;
  for (const T& v : values) out.append(to_py(v));
  return out;
}

}  // namespace hybridkv::python
