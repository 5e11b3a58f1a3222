#include "hybridkv/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace hybridkv {

namespace {

constexpr const char* kUnits = "B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB";

std::optional<long double> unit_multiplier(const std::string& unit) {
  static const struct {
    const char* name;
    long double multiplier;
  } kTable[] = {{"", 1},        {"b", 1},         {"k", 0x1p10L}, {"kib", 0x1p10L},
                {"m", 0x1p20L}, {"mib", 0x1p20L}, {"g", 0x1p30L}, {"gib", 0x1p30L},
                {"t", 0x1p40L}, {"tib", 0x1p40L}, {"p", 0x1p50L}, {"pib", 0x1p50L},
                {"kb", 1e3L},   {"mb", 1e6L},     {"gb", 1e9L},   {"tb", 1e12L},
                {"pb", 1e15L}};
  for (const auto& u : kTable) {
    if (unit == u.name) return u.multiplier;
  }
  return std::nullopt;
}

bool space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// 'text' for messages (appended, not prepended: g++ 12 at -O3 warns, wrongly, of an overlapping
// copy in "'" + std::string(text)).
std::string quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '\'';
  out.append(text);
  out += '\'';
  return out;
}

}  // namespace

Result<uint64_t> parse_byte_count(std::string_view text) {
  const std::string quoted = quote(text);
  size_t i = 0;
  while (i < text.size() && space(text[i])) ++i;
  const size_t number_begin = i;
  bool seen_digit = false, seen_dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
  }
  if (!seen_digit) {
    return Status::invalid(quoted + " does not start with a number (a byte count such as 16GiB)");
  }
  const std::string number(text.substr(number_begin, i - number_begin));
  while (i < text.size() && space(text[i])) ++i;
  const size_t unit_begin = i;
  std::string unit;
  for (; i < text.size() && !space(text[i]); ++i) {
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && space(text[i])) ++i;
  if (i != text.size()) return Status::invalid(quoted + ": text after the unit");
  const std::optional<long double> multiplier = unit_multiplier(unit);
  if (!multiplier) {
    return Status::invalid(quoted + ": unknown unit '" +
                           std::string(text.substr(unit_begin, unit.size())) +
                           "' (units: " + kUnits + ")");
  }
  const long double value = std::strtold(number.c_str(), nullptr) * *multiplier;
  if (!std::isfinite(value) || value > 0x1p63L) {
    return Status::invalid(quoted + " is more than 2^63 bytes");
  }
  return static_cast<uint64_t>(std::llround(value));
}

std::optional<uint64_t> parse_bytes(std::string_view text) {
  Result<uint64_t> r = parse_byte_count(text);
  if (!r) return std::nullopt;
  return *r;
}

Result<uint64_t> parse_count(std::string_view text) {
  const std::string quoted = quote(text);
  if (text.empty()) return Status::invalid("'' is not a count (digits only: none given)");
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      return Status::invalid(quoted + " is not a count (digits only: no sign, space or suffix)");
    }
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10)
      return Status::invalid(quoted + " is more than 2^64 - 1");
    value = value * 10 + digit;
  }
  return value;
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
