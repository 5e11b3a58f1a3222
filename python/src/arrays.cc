#include "arrays.h"

#include <nanobind/ndarray.h>

#include <string>

namespace nb = nanobind;

namespace hybridkv::python {
namespace {

// str(obj), as Python prints it.
std::string text(nb::handle obj) {
  nb::object s = nb::steal(PyObject_Str(obj.ptr()));
  if (!s.is_valid()) {
    PyErr_Clear();
    return "?";
  }
  return nb::borrow<nb::str>(s).c_str();
}

// "numpy.ndarray of dtype int64, shape (3,), strides (16,)" style: what the caller passed.
std::string describe(nb::handle obj) {
  std::string out = nb::type_name(obj.type()).c_str();
  for (const char* attr : {"dtype", "shape"}) {
    if (nb::hasattr(obj, attr)) out += std::string(" ") + attr + " " + text(obj.attr(attr));
  }
  if (nb::hasattr(obj, "flags") && nb::hasattr(obj.attr("flags"), "writeable") &&
      !nb::cast<bool>(obj.attr("flags").attr("writeable"))) {
    out += " (read-only)";
  }
  return out;
}

[[noreturn]] void refuse(const char* what, const std::string& want, nb::handle got) {
  throw nb::type_error((std::string(what) + ": expected " + want + ", got " + describe(got) +
                        " (nothing is converted: pass exactly that)")
                           .c_str());
}

bool contiguous_1d(const nb::ndarray<nb::ro>& a) {
  return a.ndim() == 1 && (a.shape(0) <= 1 || a.stride(0) == 1);
}

}  // namespace

std::span<int32_t> writable_int32(nb::handle array, const char* what) {
  const char* want = "a 1-D, contiguous, writable int32 numpy array";
  nb::ndarray<nb::ro> view;
  if (!nb::try_cast(array, view, false) || view.device_type() != nb::device::cpu::value ||
      view.dtype() != nb::dtype<int32_t>() || !contiguous_1d(view)) {
    refuse(what, want, array);
  }
  nb::ndarray<> writable;
  if (!nb::try_cast(array, writable, false)) refuse(what, want, array);
  return {static_cast<int32_t*>(writable.data()), writable.shape(0)};
}

std::vector<uint64_t> request_ids(nb::handle ids, const char* what) {
  const char* want = "a 1-D uint64 array or a list of ints";
  std::vector<uint64_t> out;
  if (nb::isinstance<nb::list>(ids) || nb::isinstance<nb::tuple>(ids)) {
    for (nb::handle item : ids) {
      if (!nb::isinstance<nb::int_>(item) || nb::isinstance<nb::bool_>(item)) {
        throw nb::type_error((std::string(what) + "[" + std::to_string(out.size()) +
                              "]: expected an int, got " + describe(item))
                                 .c_str());
      }
      uint64_t id = 0;
      if (!nb::try_cast(item, id, false)) {
        throw nb::value_error((std::string(what) + "[" + std::to_string(out.size()) +
                               "]: " + text(item) + " is not in [0, 2^64)")
                                  .c_str());
      }
      out.push_back(id);
    }
    return out;
  }
  nb::ndarray<nb::ro> view;
  if (!nb::try_cast(ids, view, false) || view.device_type() != nb::device::cpu::value ||
      view.dtype() != nb::dtype<uint64_t>() || view.ndim() != 1) {
    refuse(what, want, ids);
  }
  const auto* data = static_cast<const uint64_t*>(view.data());
  out.reserve(view.shape(0));
  for (size_t i = 0; i < view.shape(0); ++i) out.push_back(data[i * view.stride(0)]);
  return out;
}

}  // namespace hybridkv::python
