// Built with -mavx2 (CMakeLists.txt) and called only where the CPU has AVX2 (xxh3.cc). It
// includes nothing but xxHash, whose functions are static here (XXH_INLINE_ALL): no inline
// function compiled for AVX2 can be merged into code that runs without it.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace hybridkv::util {

uint64_t xxh3_64_avx2(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace hybridkv::util
