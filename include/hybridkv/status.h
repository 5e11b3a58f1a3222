// Status and Result<T>: how hybridkv reports expected failures.
//
// Expected outcomes (invalid configuration, no memory, a refused resume, an unknown layer) are
// returned as values, never thrown across the library boundary. A Status is either OK or carries
// a code and a message that names the field and the value at fault ("layer 7: window 0 must be
// > 0"). Broken internal invariants are not Statuses: they abort through HKV_CHECK.
//
// Thread-safety: value types; copies are independent.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace hybridkv {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad configuration or bad call arguments
  kNotFound,            // unknown layer, role, group or file
  kOutOfPages,          // a pool group has no room left
  kFailedPrecondition,  // the object is in the wrong state for the call
  kIoError,             // a file could not be read or written
  kRefused,             // refused by a bound: the utilization gate, max live caches
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalid(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status not_found(std::string message) {
    return Status(StatusCode::kNotFound, std::move(message));
  }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: layer 7: window 0 must be > 0"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace status_detail {
// Prints why and aborts: a Result's value was taken while it holds an error, or a Result was
// built from an OK status (both are caller bugs, not expected outcomes).
[[noreturn]] void die(const char* what, const Status& status);
}  // namespace status_detail

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.is_ok()) status_detail::die("Result built from an OK status", status_);
  }

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }

  // Requires: is_ok(). Otherwise aborts, printing the status.
  const T& value() const& {
    if (!value_) status_detail::die("Result::value() on an error", status_);
    return *value_;
  }
  T& value() & {
    if (!value_) status_detail::die("Result::value() on an error", status_);
    return *value_;
  }
  T&& value() && {
    if (!value_) status_detail::die("Result::value() on an error", status_);
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace hybridkv
