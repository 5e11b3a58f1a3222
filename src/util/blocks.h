// Token blocks: block i covers tokens [i * tpb, (i + 1) * tpb).
#pragma once

#include <cstdint>

namespace hybridkv {

// Blocks that hold `tokens` tokens (rounded up).
inline uint64_t blocks_for(uint64_t tokens, uint32_t tokens_per_block) {
  return (tokens + tokens_per_block - 1) / tokens_per_block;
}

}  // namespace hybridkv
