// Library errors as Python exceptions.
#include <stdexcept>

#include "bindings.h"

namespace nb = nanobind;

namespace hybridkv::python {
namespace {

// C++ carriers of the three hybridkv exception types (translated by nanobind).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct OutOfPages : Error {
  using Error::Error;
};
struct Refused : Error {
  using Error::Error;
};

}  // namespace

void raise_if_error(const Status& status) {
  if (status.is_ok()) return;
  const std::string& message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      throw nb::value_error(message.c_str());
    case StatusCode::kNotFound:
      throw nb::key_error(message.c_str());
    case StatusCode::kOutOfPages:
      throw OutOfPages(message);
    case StatusCode::kRefused:
      throw Refused(message);
    default:
      throw Error(std::string(status_code_name(status.code())) + ": " + message);
  }
}

void assign(nb::handle self, const nb::kwargs& kwargs) {
  for (auto [key, value] : kwargs) {
    if (!nb::hasattr(self, key)) {
      throw nb::type_error((std::string(nb::str(nb::type_name(self.type())).c_str()) +
                            ": no field '" + nb::str(key).c_str() + "'")
                               .c_str());
    }
    nb::setattr(self, key, value);
  }
}

void bind_errors(nb::module_& m) {
  static nb::exception<Error> error(m, "HybridKvError", PyExc_RuntimeError);
  static nb::exception<OutOfPages> out_of_pages(m, "OutOfPagesError", error.ptr());
  static nb::exception<Refused> refused(m, "RefusedError", error.ptr());
}

}  // namespace hybridkv::python
