// The backend the backend-independent tests run on: host by default (CI); with
// HYBRIDKV_TEST_BACKEND=cuda the same tests run on the GPU (their CTest twins, label `gpu`).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "hybridkv/memory.h"

namespace hybridkv::testing {

inline BackendOptions test_backend() {
  const char* env = std::getenv("HYBRIDKV_TEST_BACKEND");
  if (env != nullptr && std::string(env) == "cuda") return {BackendKind::kCuda};
  return {BackendKind::kHost};
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
