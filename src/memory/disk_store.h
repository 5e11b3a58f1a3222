// The DISK tier: one file per pool under the tier's directory, written and read with O_DIRECT
// through aligned staging buffers by a small pool of threads (pread/pwrite).
//
// The files are created unlinked-on-open (O_TMPFILE, or a named file removed at once), so data
// on disk never outlives the manager. A slot whose write failed is marked bad: a later read of
// it fills the destination with 0xff bytes (NaN in every float type) instead of stale data and
// records the failure (status()), so a failed write is never read as if it were valid.
//
// Thread-safety: run() from one thread at a time (the backend's copy queue); status() any time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hybridkv/env.h"
#include "hybridkv/plan.h"
#include "hybridkv/status.h"

namespace hybridkv::memory {

// One pool's slot moved between the disk and CPU-addressable memory.
struct DiskOp {
  bool to_disk = true;
  PoolGroupId pool_group;
  uint32_t pool = 0;
  uint32_t slot = 0;
  std::byte* memory = nullptr;  // source (to_disk) or destination
  int64_t from_slot = -1;       // >= 0: a copy within the disk, from_slot -> slot (no memory)
};

class DiskStore {
 public:
  // Opens the files of `tier` (a DISK tier of `plan`) under `directory`: a missing, read-only or
  // too small directory is an error naming it.
  static Result<std::unique_ptr<DiskStore>> open(const std::string& directory,
                                                 const StoragePlan& plan, uint32_t tier,
                                                 std::shared_ptr<Env> env);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Runs the operations; those that touch different slots run in parallel.
  void run(std::span<const DiskOp> ops);
  // The first I/O failure so far (ok when none).
  Status status() const;

 private:
  struct File {
    int fd = -1;
    uint64_t slot_bytes = 0;
    uint64_t stride = 0;  // slot_bytes rounded up to the O_DIRECT alignment
  };
  DiskStore() = default;
  void run_one(const DiskOp& op, std::byte* staging);
  bool transfer(const File& f, const DiskOp& op, std::byte* staging);
  void fail(const std::string& what);
  File& file(PoolGroupId pg, uint32_t pool) { return files_[pg.value][pool]; }

  std::string directory_;
  std::vector<std::vector<File>> files_;   // [pool group][pool]
  std::vector<std::vector<uint8_t>> bad_;  // [pool group][slot * pools + pool]: write failed
  std::vector<std::byte*> staging_;        // one aligned buffer per I/O thread
  std::shared_ptr<Env> env_;               // pread / pwrite
  mutable std::mutex mu_;                  // guards status_
  Status status_;
};

}  // namespace hybridkv::memory
