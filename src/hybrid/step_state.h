// The memory behind HybridCacheManager::StepBuffers (internal to src/hybrid).
#pragma once

#include <memory>
#include <vector>

#include "hybridkv/hybrid.h"
#include "memory/step_area.h"

namespace hybridkv {

struct HybridCacheManager::StepState {
  std::unique_ptr<memory::StepArea> area;
  StepBuffers view;
  // Per (entry, table group): how many leading blocks of the staging row hold a page, so the
  // next fill rewrites only what changed (-1 past the new width).
  std::vector<uint32_t> width;
  size_t last_entries = 0;  // entries of the previous fill
};

}  // namespace hybridkv
