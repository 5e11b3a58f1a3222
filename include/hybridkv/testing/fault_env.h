// FaultInjectionEnv: an Env (hybridkv/env.h) that fails disk writes and holds copies on demand,
// passed to a manager at construction through BackendOptions::env (RocksDB's
// FaultInjectionTestFS is the model). It is how the tests reach a backend's faults: no backend
// or manager interface has a test hook.
//
// - set_disk_fault(true): every later DISK tier write fails as if the device returned EIO (the
//   slot is marked bad; a later read of it gives 0xff bytes and KvCacheManager::copy_status
//   says which write failed).
// - set_copy_gate(false): the host backend's copy thread holds the next batch (and every one
//   after it) until the gate opens, so a test proves nothing reads a page before its copy
//   completed. Open the gate before the manager is destroyed. let_copies_through(n): the
//   next n batches run while the gate stays shut (a test holds one batch behind others).
// - set_copy_jitter(max_us, seed): each batch waits a random 0..max_us microseconds first, so
//   two backends' copies finish in different orders and at different times.
//
// Thread-safety: every call is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "hybridkv/env.h"

namespace hybridkv::testing {

class FaultInjectionEnv : public Env {
 public:
  bool write_at(int fd, const void* src, size_t n, uint64_t offset) override;
  void run_copies(const std::function<void()>& batch) override;

  void set_disk_fault(bool on) { disk_fault_ = on; }
  void set_copy_gate(bool open);
  void let_copies_through(uint64_t batches);
  void set_copy_jitter(uint32_t max_us, uint64_t seed);
  // Batches run so far (for a test that waits until one is held).
  uint64_t batches_run() const { return batches_run_; }

 private:
  std::atomic<bool> disk_fault_{false};
  std::atomic<uint64_t> batches_run_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool gate_open_ = true;
  uint64_t let_through_ = 0;
  uint32_t jitter_us_ = 0;
  uint64_t jitter_state_ = 0;
};

}  // namespace hybridkv::testing
