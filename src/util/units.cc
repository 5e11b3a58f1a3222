#include "hybridkv/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace hybridkv {

std::optional<uint64_t> parse_bytes(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t number_begin = i;
  bool seen_digit = false, seen_dot = false;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++i;
  }
  if (!seen_digit) return std::nullopt;
  const std::string number(text.substr(number_begin, i - number_begin));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return std::nullopt;

  long double multiplier = 1;
  if (unit.empty() || unit == "b")
    multiplier = 1;
  else if (unit == "k" || unit == "kib")
    multiplier = 1024.0L;
  else if (unit == "m" || unit == "mib")
    multiplier = 1024.0L * 1024;
  else if (unit == "g" || unit == "gib")
    multiplier = 1024.0L * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    multiplier = 1024.0L * 1024 * 1024 * 1024;
  else if (unit == "kb")
    multiplier = 1e3L;
  else if (unit == "mb")
    multiplier = 1e6L;
  else if (unit == "gb")
    multiplier = 1e9L;
  else if (unit == "tb")
    multiplier = 1e12L;
  else
    return std::nullopt;

  const long double value = std::strtold(number.c_str(), nullptr) * multiplier;
  if (!std::isfinite(value) || value < 0 || value > 9.0e18L) return std::nullopt;
  return static_cast<uint64_t>(std::llround(value));
}

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", value, kUnits[unit]);
  }
  return buf;
}

}  // namespace hybridkv
