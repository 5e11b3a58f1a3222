#include "hybridkv/status.h"

#include <cstdio>
#include <cstdlib>

namespace hybridkv {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kOutOfPages:
      return "out of pages";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kIoError:
      return "io error";
    case StatusCode::kRefused:
      return "refused";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

namespace status_detail {
void die(const char* what, const Status& status) {
  std::fprintf(stderr, "hybridkv: %s: %s\n", what, status.to_string().c_str());
  std::abort();
}
}  // namespace status_detail

}  // namespace hybridkv
