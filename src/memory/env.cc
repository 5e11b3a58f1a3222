#include "hybridkv/env.h"

#include <unistd.h>

namespace hybridkv {

bool Env::write_at(int fd, const void* src, size_t n, uint64_t offset) {
  return pwrite(fd, src, n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n);
}

bool Env::read_at(int fd, void* dst, size_t n, uint64_t offset) {
  return pread(fd, dst, n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n);
}

const std::shared_ptr<Env>& Env::system() {
  static const auto* env = new std::shared_ptr<Env>(std::make_shared<Env>());
  return *env;
}

}  // namespace hybridkv
