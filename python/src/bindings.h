// The pieces of the Python module, one file each.
#pragma once

#include <nanobind/nanobind.h>

#include "hybridkv/status.h"

namespace hybridkv::python {

// Raises the Python exception for a failed Status: ValueError (kInvalidArgument),
// KeyError (kNotFound), OutOfPagesError (kOutOfPages), RefusedError (kRefused), else
// HybridKvError. Every message is the library's.
void raise_if_error(const Status& status);
template <typename T>
T value_or_raise(Result<T> result) {
  raise_if_error(result.status());
  return std::move(result).value();
}

void bind_errors(nanobind::module_& m);
void bind_configs(nanobind::module_& m);
void bind_manager(nanobind::module_& m);

}  // namespace hybridkv::python
