#include "hybridkv/testing/fault_env.h"

#include <chrono>
#include <thread>

#include <cerrno>

namespace hybridkv::testing {

bool FaultInjectionEnv::write_at(int fd, const void* src, size_t n, uint64_t offset) {
  if (disk_fault_) {
    errno = EIO;
    return false;
  }
  return Env::write_at(fd, src, n, offset);
}

void FaultInjectionEnv::run_copies(const std::function<void()>& batch) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return gate_open_ || let_through_ > 0; });
    if (!gate_open_) --let_through_;
  }
  uint32_t delay = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jitter_us_ > 0) {
      jitter_state_ = jitter_state_ * 6364136223846793005ull + 1442695040888963407ull;
      delay = static_cast<uint32_t>((jitter_state_ >> 33) % (jitter_us_ + 1));
    }
  }
  if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
  batch();
  ++batches_run_;
}

void FaultInjectionEnv::set_copy_gate(bool open) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = open;
    let_through_ = 0;
  }
  cv_.notify_all();
}

void FaultInjectionEnv::set_copy_jitter(uint32_t max_us, uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  jitter_us_ = max_us;
  jitter_state_ = seed;
}

void FaultInjectionEnv::let_copies_through(uint64_t batches) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    let_through_ += batches;
  }
  cv_.notify_all();
}

}  // namespace hybridkv::testing
