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

// Sets every keyword as an attribute: an unknown name is a TypeError naming it.
void assign(nanobind::handle self, const nanobind::kwargs& kwargs);

// A class whose __init__ takes keyword arguments over the C++ defaults.
template <typename T>
void kw_init(nanobind::class_<T>& cls) {
  namespace nb = nanobind;
  cls.def(nb::init<>());
  cls.def("__init__", [](nb::handle self, nb::kwargs kwargs) {
    new (nb::inst_ptr<T>(self)) T();
    nb::inst_mark_ready(self);
    assign(self, kwargs);
  });
}

void bind_errors(nanobind::module_& m);
void bind_configs(nanobind::module_& m);
void bind_manager(nanobind::module_& m);
void bind_kv_cache(nanobind::module_& m);

}  // namespace hybridkv::python
