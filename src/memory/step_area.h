// StepArea: the memory a step's index buffers live in, at one address for the manager's life
// (HybridCacheManager::step_buffers). With the cuda backend the area is device memory on the
// GPU tier's device, written from pinned staging by one copy per step on the engine's stream,
// so that a CUDA graph captures kernels that read it; elsewhere it is host memory written in
// place.
//
// Staging is reused: staging() first waits until the previous upload has read it. Both the
// staging and the area start as 0xff bytes (-1 in every int32).
// Thread-safety: none (the scheduler thread that runs the steps).
#pragma once

#include <cstddef>
#include <memory>

#include "hybridkv/memory.h"
#include "hybridkv/status.h"

namespace hybridkv::memory {

class StepArea {
 public:
  virtual ~StepArea() = default;
  // Where the engine's kernels read; never moves.
  virtual std::byte* data() const = 0;
  // Where the next step is written (data() itself in host memory).
  virtual std::byte* staging() = 0;
  // Makes the first `bytes` of staging visible at data(), ordered on `stream`.
  virtual Status upload(size_t bytes, Stream stream) = 0;
  virtual bool on_device() const = 0;
};

// `bytes` of zeroed host memory.
std::unique_ptr<StepArea> make_host_step_area(size_t bytes);

}  // namespace hybridkv::memory
