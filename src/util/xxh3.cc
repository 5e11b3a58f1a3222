#include "util/xxh3.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hybridkv::util {

#ifdef HKV_XXH3_AVX2
uint64_t xxh3_64_avx2(const void* data, size_t bytes);  // xxh3_avx2.cc
#endif

uint64_t xxh3_64(const void* data, size_t bytes) {
#ifdef HKV_XXH3_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return xxh3_64_avx2(data, bytes);
#endif
  return XXH3_64bits(data, bytes);
}

}  // namespace hybridkv::util
