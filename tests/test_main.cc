// gtest's main, plus: a run asked for the CUDA backend (HYBRIDKV_TEST_BACKEND=cuda) on a machine
// where it cannot work (no GPU, or a library built without CUDA) says why and exits 77, which
// CTest reports as skipped.
#include <gtest/gtest.h>

#include <cstdio>

#include "hybridkv/manager.h"
#include "test_backend.h"

namespace {

int skip_without_cuda() {
  using namespace hybridkv;
  if (hybridkv::testing::test_backend().kind != BackendKind::kCuda) return 0;
  ManagerConfig c;
  AttentionLayerConfig layer;
  layer.id = 0;
  layer.buffers = {{"key", 4096, {}, {}}};
  c.attention_layers = {layer};
  c.tiers = {{TierKind::kGpu, 4ull << 20, ""}};
  const Result<std::unique_ptr<KvCacheManager>> m = KvCacheManager::create(c, {BackendKind::kCuda});
  if (m.is_ok()) return 0;
  std::printf("SKIPPED: HYBRIDKV_TEST_BACKEND=cuda, but %s\n", m.status().message().c_str());
  return 77;
}

}  // namespace

int main(int argc, char** argv) {
  if (const int skip = skip_without_cuda()) return skip;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
