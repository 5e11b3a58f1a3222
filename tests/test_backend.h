// The backend the backend-independent tests run on: host by default; with
// HYBRIDKV_TEST_BACKEND=cuda the same tests run on the GPU (their CTest twins, label `gpu`), and
// with HYBRIDKV_TEST_BACKEND=engine on memory the engine owns (a fresh testing::HostEngine per
// call: one per manager; their CTest twins `_engine`, run in CI). HYBRIDKV_TEST_RANKS=2 holds
// two tensor-parallel ranks in each manager (BackendOptions::devices; the fake engine writes and
// checks both): on CUDA, one per device where there are two, else both on device 0 (twins
// `_ranks` on the host backend in CI, `_cuda_ranks` on the GPU).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "hybridkv/memory.h"
#include "hybridkv/testing/host_engine.h"

namespace hybridkv::testing {

// `system`: the Env the backend runs on (null: the real one).
inline BackendOptions test_backend(std::shared_ptr<Env> system = nullptr) {
  const char* env = std::getenv("HYBRIDKV_TEST_BACKEND");
  const std::string kind = env != nullptr ? env : "host";
  BackendOptions o{kind == "cuda" ? BackendKind::kCuda : BackendKind::kHost};
  if (kind == "engine") {
    o.kind = BackendKind::kEngine;
    o.engine = std::make_shared<HostEngine>(system);
    return o;
  }
  o.env = std::move(system);
  if (const char* ranks = std::getenv("HYBRIDKV_TEST_RANKS")) {
    const int n = std::atoi(ranks);
    const int devices = o.kind == BackendKind::kCuda ? std::max(cuda_device_count(), 1) : 1;
    for (int r = 0; r < n; ++r) o.devices.push_back(r % devices);
  }
  return o;
}

// A fresh directory for a DISK tier under $TMPDIR (or /tmp), removed by the caller or the OS.
inline std::string make_temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/hybridkv-test-XXXXXX";
  return mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
}

// Removes the directory when the test ends.
struct TempDir {
  std::string path = make_temp_dir();
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace hybridkv::testing
