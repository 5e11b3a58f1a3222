#include "memory/step_area.h"

#include "memory/backend.h"

#include <vector>

namespace hybridkv::memory {
namespace {

class HostStepArea final : public StepArea {
 public:
  explicit HostStepArea(size_t bytes) : bytes_(bytes, std::byte{0xff}) {}  // -1 everywhere
  std::byte* data() const override { return const_cast<std::byte*>(bytes_.data()); }
  std::byte* staging() override { return bytes_.data(); }
  Status upload(size_t, Stream) override { return Status::ok(); }
  bool on_device() const override { return false; }

 private:
  std::vector<std::byte> bytes_;  // sized once, never reallocated
};

}  // namespace

std::unique_ptr<StepArea> make_host_step_area(size_t bytes) {
  return std::make_unique<HostStepArea>(bytes);
}

Result<std::unique_ptr<StepArea>> MemoryBackend::make_step_area(size_t bytes, uint32_t) {
  return make_host_step_area(bytes);
}

}  // namespace hybridkv::memory
