// Numbers as people write them: byte quantities ("16GiB", "512 MiB", "1.5GB", "4096") and plain
// counts ("512"), read strictly: no sign, no trailing characters, no overflow.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hybridkv/status.h"

namespace hybridkv {

// A byte count with an optional unit (B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB; K/M/G/T/P
// alone are binary), at most 2^63 bytes. The error says which part is wrong: the number, the
// unit (naming the ones known), or the size.
Result<uint64_t> parse_byte_count(std::string_view text);
// parse_byte_count without the reason: nullopt for anything it refuses.
std::optional<uint64_t> parse_bytes(std::string_view text);
// A decimal count: digits only (no sign, space or suffix), at most 2^64 - 1. The error quotes
// the text.
Result<uint64_t> parse_count(std::string_view text);
// "16.00 GiB (17179869184 B)" style: the largest binary unit, two decimals.
std::string format_bytes(uint64_t bytes);

}  // namespace hybridkv
