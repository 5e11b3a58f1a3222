// The backends behind make_backend (internal).
#pragma once

#include <memory>
#include <string>

#include "memory/backend.h"

namespace hybridkv::memory {

std::unique_ptr<MemoryBackend> make_host_backend(std::shared_ptr<Env> env, size_t ranks = 1);
std::unique_ptr<MemoryBackend> make_engine_backend(std::shared_ptr<EngineMemory> engine);
// An error naming why when the library was built without CUDA.
Result<std::unique_ptr<MemoryBackend>> make_cuda_backend(const BackendOptions& options);

// The directory of the plan's DISK tier (TierConfig::path); empty without one.
std::string disk_directory(const StoragePlan& plan);
// Index of the plan's tier of `kind`, or -1.
int tier_position(const StoragePlan& plan, TierKind kind);

}  // namespace hybridkv::memory
