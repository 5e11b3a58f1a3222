// Memory backends and copy ordering, as the engine sees them.
//
// A backend owns the bytes of every pool on every tier: `kNone` owns none (metadata only, for
// planning and trace simulation at any scale), `kHost` keeps every tier in host memory (one
// allocation per pool, stable addresses; the default for tests and the demo), `kCuda` keeps the
// GPU tier in device memory and HOST in pinned memory; `kEngine` owns none and hands the engine,
// which owns the pools, the copies to run (hybridkv/engine_memory.h). Pages move between tiers
// through the backend's copy engine: batched, asynchronous, executed in submission order. Each
// submission returns a CopyEvent; a page records the event of its last writer, and whoever
// reads or overwrites its slot waits for it (the manager hands the engine one event per step to
// wait on).
//
// Thread-safety: value types here; the backends themselves are internal to the manager.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace hybridkv {

class Env;
class EngineMemory;

enum class BackendKind : uint8_t { kNone, kHost, kCuda, kEngine };
const char* backend_kind_name(BackendKind kind);

// The completion of a batch of copies. Tickets grow with every submission; 0 is "nothing to wait
// for". An event is complete once every copy submitted up to it has finished.
struct CopyEvent {
  uint64_t ticket = 0;
  bool operator==(const CopyEvent&) const = default;
};

// An engine stream (cudaStream_t for the CUDA backend; ignored by the host and none backends).
struct Stream {
  uintptr_t handle = 0;
};

// One CPU <-> pool memory transfer (the testing library's read_pool_bytes / write_pool_bytes).
struct PoolTransfer {
  std::byte* pool = nullptr;  // a slot address (KvCacheManager::slot_address) plus an offset
  std::byte* host = nullptr;  // CPU memory
  size_t bytes = 0;
};

struct BackendOptions {
  BackendKind kind = BackendKind::kHost;
  int device = 0;  // kCuda: the CUDA device of the GPU tier (one rank)
  // The system the backend runs on (disk I/O, the host copy thread; hybridkv/env.h); null:
  // Env::system().
  std::shared_ptr<Env> env = nullptr;
  // kEngine: the engine's memory (optional: without it the copies are only taken with
  // KvCacheManager::take_copies, and slot addresses are nullptr).
  std::shared_ptr<EngineMemory> engine = nullptr;
  // Tensor-parallel ranks in one process (issue 34): one entry per rank, each rank's pools (its
  // share of the plan: the plan is per rank) on that CUDA device, its HOST pools in its own
  // pinned memory and its DISK pools in its own files. Every copy runs on every rank at once,
  // one set of tables for all (KvCacheManager::ranks, slot_address's rank). Empty: one rank on
  // `device`. kHost: one rank per entry, the numbers unused (several ranks without a GPU, for
  // tests). Refused on kNone, kEngine (the engine runs the copy lists on its ranks itself) and
  // with a shared tier.
  std::vector<int> devices = {};
};

// Whether this library was built with the CUDA backend (kCuda otherwise is refused at creation).
bool cuda_backend_built();
// CUDA devices this process sees (0 without CUDA, a driver or a device).
int cuda_device_count();

}  // namespace hybridkv
