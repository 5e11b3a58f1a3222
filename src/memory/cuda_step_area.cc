// The CUDA backend's step area: device memory on the GPU tier's device, written from pinned
// staging by one cudaMemcpyAsync per step on the engine's stream; an event after each copy
// guards the staging buffer against the next step's writes.
#include <cuda_runtime.h>

#include <cstring>

#include "memory/cuda_backend.h"
#include "memory/cuda_memory.h"
#include "memory/step_area.h"

namespace hybridkv::memory {
namespace {

class CudaStepArea final : public StepArea {
 public:
  ~CudaStepArea() override {
    if (copied_ != nullptr) {
      cudaEventSynchronize(copied_);
      cudaEventDestroy(copied_);
    }
    cudaFree(device_);
    cudaFreeHost(staging_);
  }

  static Result<std::unique_ptr<StepArea>> make(int device, size_t bytes) {
    std::unique_ptr<CudaStepArea> a(new CudaStepArea());
    a->device_id_ = device;
    const std::string what =
        "step buffers of " + std::to_string(bytes) + " bytes on device " + std::to_string(device);
    cuda_detail::DeviceScope on(device);
    void* dev = nullptr;
    if (cudaError_t e = cudaMalloc(&dev, bytes); e != cudaSuccess)
      return cuda::cuda_status(e, what + " (cudaMalloc)");
    a->device_ = static_cast<std::byte*>(dev);
    void* host = nullptr;
    if (cudaError_t e = cudaMallocHost(&host, bytes); e != cudaSuccess)
      return cuda::cuda_status(e, what + " (cudaMallocHost)");
    a->staging_ = static_cast<std::byte*>(host);
    std::memset(host, 0xff, bytes);  // staging and device both start as -1 everywhere
    if (cudaError_t e = cudaEventCreateWithFlags(&a->copied_, cudaEventDisableTiming);
        e != cudaSuccess)
      return cuda::cuda_status(e, what + " (cudaEventCreate)");
    if (cudaError_t e = cudaMemset(dev, 0xff, bytes); e != cudaSuccess)  // -1 everywhere
      return cuda::cuda_status(e, what + " (cudaMemset)");
    return std::unique_ptr<StepArea>(std::move(a));
  }

  std::byte* data() const override { return device_; }
  std::byte* staging() override {
    if (pending_) HKV_CUDA_OK(cudaEventSynchronize(copied_));  // the last upload has read it
    pending_ = false;
    return staging_;
  }
  Status upload(size_t bytes, Stream stream) override {
    const auto s = reinterpret_cast<cudaStream_t>(stream.handle);
    cuda_detail::DeviceScope on(device_id_);
    if (cudaError_t e = cudaMemcpyAsync(device_, staging_, bytes, cudaMemcpyHostToDevice, s);
        e != cudaSuccess)
      return cuda::cuda_status(e, "step buffers: cudaMemcpyAsync");
    HKV_CUDA_OK(cudaEventRecord(copied_, s));
    pending_ = true;
    return Status::ok();
  }
  bool on_device() const override { return true; }

 private:
  CudaStepArea() = default;
  int device_id_ = 0;
  std::byte* device_ = nullptr;
  std::byte* staging_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  bool pending_ = false;
};

}  // namespace

namespace cuda_detail {
Result<std::unique_ptr<StepArea>> CudaBackend::make_step_area(size_t bytes, uint32_t rank) {
  if (rank >= ranks()) {
    return Status::invalid("step buffers: rank " + std::to_string(rank) + " of " +
                           std::to_string(ranks()));
  }
  return CudaStepArea::make(ranks_[rank]->device, bytes);
}
}  // namespace cuda_detail

}  // namespace hybridkv::memory
