// splitmix64's finalizer: a fast, well-spread 64-bit mix for deterministic test and trace
// data (not for keys that must resist collisions: those use SHA-256).
#pragma once

#include <cstdint>

namespace hybridkv {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace hybridkv
