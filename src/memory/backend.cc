// The none and host backends.
#include "memory/backend.h"

#include "hybridkv/units.h"

#include "memory/backends.h"

namespace hybridkv {

const char* backend_kind_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kNone:
      return "none";
    case BackendKind::kHost:
      return "host";
    case BackendKind::kCuda:
      return "cuda";
    case BackendKind::kEngine:
      return "engine";
  }
  return "?";
}

}  // namespace hybridkv

namespace hybridkv::memory {
namespace {

// Metadata only: copies complete at once.
class NoneBackend final : public MemoryBackend {
 public:
  BackendKind kind() const override { return BackendKind::kNone; }
  Status allocate(const StoragePlan&) override { return Status::ok(); }
  std::byte* pool_base(TierKind, PoolGroupId, uint32_t, uint32_t) const override { return nullptr; }
  CopyEvent submit(std::vector<SlotCopy> batch) override {
    if (batch.empty()) return {};
    return {++ticket_};
  }
  void wait(CopyEvent) override {}

 private:
  uint64_t ticket_ = 0;
};

}  // namespace

Result<std::unique_ptr<MemoryBackend>> make_backend(const BackendOptions& options) {
  if (options.devices.size() > 1 &&
      (options.kind == BackendKind::kNone || options.kind == BackendKind::kEngine)) {
    return Status::invalid(std::string("backend '") + backend_kind_name(options.kind) +
                           "': " + std::to_string(options.devices.size()) +
                           " devices given; several ranks are for the host and cuda backends (the "
                           "engine runs one copy list on all its ranks)");
  }
  if (options.devices.size() > 255) {
    return Status::invalid("devices: " + std::to_string(options.devices.size()) +
                           " ranks; at most 255");
  }
  switch (options.kind) {
    case BackendKind::kNone:
      return std::unique_ptr<MemoryBackend>(new NoneBackend());
    case BackendKind::kHost:
      return make_host_backend(options.env, std::max<size_t>(options.devices.size(), 1));
    case BackendKind::kCuda:
      return make_cuda_backend(options);
    case BackendKind::kEngine:
      return make_engine_backend(options.engine);
  }
  return Status::invalid("unknown backend kind");
}

#ifndef HYBRIDKV_HAVE_CUDA
Result<std::unique_ptr<MemoryBackend>> make_cuda_backend(const BackendOptions&) {
  return Status::invalid(
      "backend 'cuda': this library was built without CUDA (configure with nvcc present and "
      "-DHYBRIDKV_CUDA=ON)");
}
#endif

}  // namespace hybridkv::memory

namespace hybridkv {
#ifdef HYBRIDKV_HAVE_CUDA
bool cuda_backend_built() { return true; }
#else
bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
#endif
}  // namespace hybridkv
