// Byte quantities as people write them: "16GiB", "512 MiB", "1.5GB", "4096".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hybridkv {

// Parses a byte count with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, K, M, G, T;
// K/M/G/T alone are binary). nullopt for anything else, negative values, or overflow.
std::optional<uint64_t> parse_bytes(std::string_view text);
// "16.00 GiB (17179869184 B)" style: the largest binary unit, two decimals.
std::string format_bytes(uint64_t bytes);

}  // namespace hybridkv
