#include "memory/disk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "hybridkv/units.h"

namespace hybridkv::memory {
namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint64_t kStagingBytes = 4ull << 20;  // per I/O thread
constexpr uint32_t kThreads = 8;

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

std::string errno_text() { return std::strerror(errno); }

// A file nobody else can open and that vanishes with its descriptor.
int open_private_file(const std::string& dir, bool direct) {
  const int flags = O_RDWR | (direct ? O_DIRECT : 0);
#ifdef O_TMPFILE
  int fd = ::open(dir.c_str(), flags | O_TMPFILE, 0600);
  if (fd >= 0) return fd;
#endif
  std::string name = dir + "/hybridkv-XXXXXX";
  fd = mkstemp(name.data());
  if (fd < 0) return -1;
  unlink(name.c_str());
  if (direct) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT);
  return fd;
}

}  // namespace

Result<std::unique_ptr<DiskStore>> DiskStore::open(const std::string& directory,
                                                   const StoragePlan& plan, uint32_t tier,
                                                   std::shared_ptr<Env> env) {
  const TierPlan& tp = plan.tiers()[tier];
  const std::string where = "DISK tier directory '" + directory + "'";
  struct stat st {};
  if (::stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::invalid(where + " does not exist or is not a directory");
  }
  if (access(directory.c_str(), W_OK) != 0) return Status::invalid(where + " is not writable");
  uint64_t total = 0;
  for (const PoolGroup& pg : plan.pool_groups()) {
    for (const Pool& pool : pg.pools)
      total += round_up(pool.slot_bytes, kAlign) * tp.slots[pg.id.value];
  }
  struct statvfs vfs {};
  if (statvfs(directory.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    if (free_bytes < total) {
      return Status(StatusCode::kOutOfPages, where + " has " + format_bytes(free_bytes) +
                                                 " free; the tier needs " + format_bytes(total));
    }
  }
  std::unique_ptr<DiskStore> d(new DiskStore());
  d->directory_ = directory;
  d->env_ = env ? std::move(env) : Env::system();
  d->files_.resize(plan.pool_groups().size());
  d->bad_.resize(plan.pool_groups().size());
  for (const PoolGroup& pg : plan.pool_groups()) {
    d->bad_[pg.id.value].assign(tp.reserved_slots[pg.id.value] * pg.pools.size(), 0);
    for (const Pool& pool : pg.pools) {
      File f;
      f.slot_bytes = pool.slot_bytes;
      f.stride = round_up(pool.slot_bytes, kAlign);
      // O_DIRECT where the file system takes it (tmpfs does not): no page cache in the way.
      f.fd = open_private_file(directory, true);
      if (f.fd < 0) f.fd = open_private_file(directory, false);
      if (f.fd < 0) return Status::invalid(where + ": cannot create a file: " + errno_text());
      d->files_[pg.id.value].push_back(f);
    }
  }
  for (uint32_t i = 0; i < kThreads; ++i) {
    d->staging_.push_back(static_cast<std::byte*>(std::aligned_alloc(kAlign, kStagingBytes)));
  }
  return d;
}

DiskStore::~DiskStore() {
  for (auto& files : files_)
    for (File& f : files)
      if (f.fd >= 0) ::close(f.fd);
  for (std::byte* s : staging_) std::free(s);
}

void DiskStore::fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status_) status_ = Status(StatusCode::kInvalidArgument, "DISK tier: " + what);
}

Status DiskStore::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

bool DiskStore::transfer(const File& f, const DiskOp& op, std::byte* staging) {
  const uint64_t at = uint64_t{op.slot} * f.stride;
  for (uint64_t done = 0; done < f.slot_bytes; done += kStagingBytes) {
    const uint64_t n = std::min(kStagingBytes, f.slot_bytes - done);
    const uint64_t io = round_up(n, kAlign);
    if (op.to_disk) {
      std::memcpy(staging, op.memory + done, n);
      if (io > n) std::memset(staging + n, 0, io - n);
      if (!env_->write_at(f.fd, staging, io, at + done)) return false;
    } else {
      if (!env_->read_at(f.fd, staging, io, at + done)) return false;
      std::memcpy(op.memory + done, staging, n);
    }
  }
  return true;
}

void DiskStore::run_one(const DiskOp& op, std::byte* staging) {
  if (op.from_slot >= 0) {  // within the disk (a pool resized): read, then write
    std::vector<std::byte> bytes(file(op.pool_group, op.pool).slot_bytes);
    run_one({false, op.pool_group, op.pool, static_cast<uint32_t>(op.from_slot), bytes.data()},
            staging);
    run_one({true, op.pool_group, op.pool, op.slot, bytes.data()}, staging);
    return;
  }
  const File& f = file(op.pool_group, op.pool);
  uint8_t& bad = bad_[op.pool_group.value][op.slot * files_[op.pool_group.value].size() + op.pool];
  const std::string what = std::string(op.to_disk ? "writing" : "reading") + " pool group " +
                           std::to_string(op.pool_group.value) + " pool " +
                           std::to_string(op.pool) + " slot " + std::to_string(op.slot);
  if (!op.to_disk && bad) {
    std::memset(op.memory, 0xff, f.slot_bytes);
    fail(what + ": its last write had failed; the bytes were replaced by 0xff");
    return;
  }
  if (transfer(f, op, staging)) {
    if (op.to_disk) bad = 0;
    return;
  }
  const std::string reason = errno_text();
  if (op.to_disk) {
    bad = 1;
  } else {
    std::memset(op.memory, 0xff, f.slot_bytes);
  }
  fail(what + " under '" + directory_ + "': " + reason);
}

void DiskStore::run(std::span<const DiskOp> ops) {
  if (ops.size() <= 1) {
    for (const DiskOp& op : ops) run_one(op, staging_[0]);
    return;
  }
  // Different slots: no two operations touch the same bytes, so any order is the same.
  std::vector<std::thread> threads;
  const uint32_t n = std::min<uint32_t>(kThreads, static_cast<uint32_t>(ops.size()));
  for (uint32_t t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < ops.size(); i += n) run_one(ops[i], staging_[t]);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace hybridkv::memory
