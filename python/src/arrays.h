// Arrays crossing the Python boundary, taken exactly as given: nothing is converted behind the
// caller's back. A buffer the library writes into must be the caller's own memory (1-D,
// contiguous, writable, int32, on the CPU); ids are unsigned 64-bit integers, never floats.
// Anything else is a TypeError naming the argument and what was passed.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <span>
#include <vector>

namespace hybridkv::python {

// The int32 array the library keeps up to date in place (KvCache.set_index_buffer).
std::span<int32_t> writable_int32(nanobind::handle array, const char* what);
// Request ids: a 1-D uint64 array, or a list / tuple of Python ints in [0, 2^64).
std::vector<uint64_t> request_ids(nanobind::handle ids, const char* what);

}  // namespace hybridkv::python
