// Lists of problems as one message: the first kListedErrors each in full, then a count of the
// rest, so that a config with a million bad layers gives a line a person can read (issue 36).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace hybridkv {

inline constexpr size_t kListedErrors = 20;

// The line that stands for the problems past the first kListedErrors of `total`.
inline std::string more_errors(size_t total) {
  return "... and " + std::to_string(total - kListedErrors) + " more (" + std::to_string(total) +
         " problems in all)";
}

// "a; b; c" up to kListedErrors entries, then "; ... and N more (M problems in all)". `total`
// counts problems not in `errors` too (a list that stopped keeping them); 0: errors.size().
inline std::string join_errors(const std::vector<std::string>& errors, size_t total = 0) {
  total = std::max(total, errors.size());
  std::string message;
  for (size_t i = 0; i < errors.size() && i < kListedErrors; ++i) {
    if (i > 0) message += "; ";
    message += errors[i];
  }
  if (total > kListedErrors) message += "; " + more_errors(total);
  return message;
}

}  // namespace hybridkv
