// Env: what a memory backend asks of the operating system, replaceable at construction (the
// pattern of RocksDB's Env and FileSystem): the DISK tier's positioned reads and writes, and
// the running of each batch of host copies on the backend's copy thread.
//
// The default (Env::system()) is the plain system. An embedder passes its own subclass through
// BackendOptions::env to route disk I/O elsewhere or to observe copies; the hybridkv_testing
// library's FaultInjectionEnv fails writes and holds copies this way, so no backend or manager
// interface carries a test hook.
//
// Thread-safety: an Env is called from the backend's copy thread and the disk tier's I/O
// threads at once; implementations must be thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace hybridkv {

class Env {
 public:
  virtual ~Env() = default;
  // Writes / reads exactly `n` bytes of `fd` at `offset` (pwrite / pread). False, with errno
  // set, on an error or a short transfer: the disk tier marks the slot bad.
  virtual bool write_at(int fd, const void* src, size_t n, uint64_t offset);
  virtual bool read_at(int fd, void* dst, size_t n, uint64_t offset);
  // Runs one batch of copies on the host backend's copy thread: `batch()` at once by default.
  // The batch's event completes when this returns, so an Env that delays the call delays the
  // event; it must call `batch` exactly once.
  virtual void run_copies(const std::function<void()>& batch) { batch(); }

  // The plain system (shared, never freed).
  static const std::shared_ptr<Env>& system();
};

}  // namespace hybridkv
