// HostEngine: memory an engine owns, for tests of the engine backend (BackendKind::kEngine).
// Its pools are host memory (DISK in files, as the host backend keeps them), and it runs the
// copies the manager hands out from their lists alone (hybridkv/engine_memory.h): when a thread
// of the test waits (on_wait), or when the test calls run(), as an engine does once per step.
// What it runs is what the lists say, so a list that misses a copy or orders two wrongly shows
// up as a wrong byte in the fake engine's checks.
//
// One HostEngine serves one manager. Thread-safety: run() and on_wait() may be called from any
// thread; batches run one at a time, in order.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hybridkv/engine_memory.h"
#include "hybridkv/env.h"

namespace hybridkv::memory {
class MemoryBackend;
}

namespace hybridkv::testing {

class HostEngine final : public EngineMemory {
 public:
  explicit HostEngine(std::shared_ptr<Env> env = nullptr);
  ~HostEngine() override;

  Status attach(const StoragePlan& plan, EngineCopyQueue& queue) override;
  std::byte* pool_base(TierKind tier, PoolGroupId pool_group, uint32_t pool) const override;
  void on_wait(CopyEvent event) override;
  Status copy_status() const override;

  // Takes every batch queued, runs its lists and reports it done. Returns the batches run.
  uint64_t run();
  // Batches, lists and slot copies run so far.
  struct Counts {
    uint64_t batches = 0;
    uint64_t lists = 0;
    uint64_t copies = 0;
  };
  Counts counts() const;
  // Keeps every batch it runs from now on, for take_ran (ranks comparing their copy lists).
  void record(bool on);
  std::vector<EngineCopyBatch> take_ran();

 private:
  std::shared_ptr<Env> env_;
  std::unique_ptr<memory::MemoryBackend> memory_;  // the pools and a copy engine for them
  EngineCopyQueue* queue_ = nullptr;
  mutable std::mutex mu_;  // one run at a time
  Counts counts_;
  bool record_ = false;
  std::vector<EngineCopyBatch> ran_;
};

}  // namespace hybridkv::testing
