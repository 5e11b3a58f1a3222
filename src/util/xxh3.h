// XXH3-64 of a buffer with the widest vector unit the CPU has: AVX2 where present (a separate
// translation unit built with -mavx2, chosen at run time), else the SSE2 code every x86-64 runs.
// The two give the same value. Long prompts are fingerprinted on the step that admits them: an
// 85,401-token prompt (340 KB) is one pass.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hybridkv::util {

uint64_t xxh3_64(const void* data, size_t bytes);

}  // namespace hybridkv::util
