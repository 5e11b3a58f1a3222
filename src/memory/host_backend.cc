// The host backend: every tier in host memory (DISK in files), copies on a worker thread.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "hybridkv/units.h"
#include "memory/backends.h"
#include "memory/batch_runs.h"
#include "memory/convert.h"
#include "memory/disk_store.h"

namespace hybridkv::memory {
namespace {

// Every tier in host memory; copies run on a worker thread in submission order, so that a
// missing wait shows up as a wrong byte in CPU tests.
class HostBackend final : public MemoryBackend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  explicit HostBackend(std::shared_ptr<Env> env) : env_(env ? std::move(env) : Env::system()) {
    worker_ = std::thread([this] { run(); });
  }
  ~HostBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  Status allocate(const StoragePlan& plan) override {
    for (uint32_t t = 0; t < plan.tiers().size(); ++t) {
      const TierPlan& tier = plan.tiers()[t];
      if (tier.kind == TierKind::kDisk) {
        Result<std::unique_ptr<DiskStore>> disk =
            DiskStore::open(disk_directory(plan), plan, t, env_);
        if (!disk) return disk.status();
        disk_ = std::move(disk).value();
        continue;
      }
      for (const PoolGroup& pg : plan.pool_groups()) {
        for (uint32_t p = 0; p < pg.pools.size(); ++p) {
          const uint64_t bytes = tier.reserved_slots[pg.id.value] * pg.pools[p].slot_bytes;
          Region region;
          region.slot_bytes = pg.pools[p].slot_bytes;
          // calloc: large blocks come zeroed from the kernel and are touched only when used, so
          // a big quota costs nothing until pages are written (a memset faulted in every byte).
          region.bytes.reset(static_cast<std::byte*>(std::calloc(bytes == 0 ? 1 : bytes, 1)));
          if (!region.bytes) {
            const std::string what =
                tier.kind == TierKind::kGpu
                    ? "host memory (standing in for the GPU tier)"
                    : std::string("host memory for the ") + tier_kind_name(tier.kind) + " tier";
            return Status(StatusCode::kOutOfPages,
                          "host backend: cannot allocate " + format_bytes(bytes) + " of " + what +
                              " for pool group " + std::to_string(pg.id.value) +
                              "; lower the quota, or use the none backend (metadata only: "
                              "BackendKind::kNone, "
                              "--backend none)");
          }
          regions_[key(tier.kind, pg.id, p)] = std::move(region);
          pools_per_group_[pg.id.value] = static_cast<uint32_t>(pg.pools.size());
        }
      }
    }
    conversions_ = conversion_table(plan);
    return Status::ok();
  }

  std::byte* pool_base(TierKind tier, PoolGroupId pg, uint32_t pool) const override {
    auto it = regions_.find(key(tier, pg, pool));
    return it == regions_.end() ? nullptr : it->second.bytes.get();
  }

  CopyEvent submit(std::vector<SlotCopy> batch) override {
    if (batch.empty()) return {};
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t ticket = ++submitted_;
    queue_.push_back({ticket, std::move(batch)});
    cv_.notify_all();
    return {ticket};
  }

  void wait(CopyEvent event) override {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t ticket = std::min(event.ticket, submitted_);  // a future ticket: all so far
    done_cv_.wait(lock, [&] { return completed_ >= ticket; });
  }

  bool cancel(CopyEvent event, uint32_t index) override {
    std::lock_guard<std::mutex> lock(mu_);
    return cancel_queued(queue_, event, index);  // batches still queued have not started
  }

  Status copy_status() const override { return disk_ ? disk_->status() : Status::ok(); }

 private:
  struct FreeBytes {
    void operator()(std::byte* p) const { std::free(p); }
  };
  struct Region {
    std::unique_ptr<std::byte, FreeBytes> bytes;
    uint64_t slot_bytes = 0;
  };
  using Batch = QueuedBatch;

  static uint64_t key(TierKind tier, PoolGroupId pg, uint32_t pool) {
    return (static_cast<uint64_t>(tier) << 48) | (static_cast<uint64_t>(pg.value) << 16) | pool;
  }

  void run() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping with nothing left
      }
      // The Env runs the batch: one that holds it leaves it queued (and cancellable).
      env_->run_copies([this] { run_front(); });
    }
  }

  // Takes the queue's first batch (only this thread takes), runs it and completes its event.
  void run_front() {
    Batch batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    execute(batch.copies);
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_ = batch.ticket;
    }
    done_cv_.notify_all();
  }

  void execute(std::span<const SlotCopy> copies) {
    for_each_run(
        copies,
        [&](size_t first, size_t last) {
          for (size_t i = first; i < last; ++i) run_memory(copies[i]);
        },
        [&](size_t first, size_t last) {
          std::vector<DiskOp> ops;
          for (size_t i = first; i < last; ++i) {
            const SlotCopy& c = copies[i];
            if (c.cancelled) continue;
            const bool to_disk = c.dst_tier == TierKind::kDisk;
            if (c.src_tier == c.dst_tier) {  // within the disk: no memory side
              append_disk_ops(c, pools_per_group_.at(c.pool_group.value), no_memory, ops);
              continue;
            }
            append_disk_ops(
                c, pools_per_group_.at(c.pool_group.value),
                [&](uint32_t p) {
                  return slot_bytes_at(to_disk ? c.src_tier : c.dst_tier, c.pool_group, p,
                                       to_disk ? c.src_slot : c.dst_slot);
                },
                ops);
          }
          disk_->run(ops);
        });
  }

  std::byte* slot_bytes_at(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t slot) const {
    const Region& r = regions_.at(key(tier, pg, pool));
    return r.bytes.get() + slot * r.slot_bytes;
  }

  void run_memory(const SlotCopy& c) {
    if (c.cancelled) return;
    if (c.dst_pool_group) {
      run_converted(c);
      return;
    }
    const uint32_t pools = pools_per_group_.at(c.pool_group.value);
    if (c.dst_host != nullptr) {  // the slot's pools, one after the other, into host memory
      std::byte* at = c.dst_host;
      for (uint32_t p = 0; p < pools; ++p) {
        const uint64_t n = regions_.at(key(c.src_tier, c.pool_group, p)).slot_bytes;
        std::memcpy(at, slot_bytes_at(c.src_tier, c.pool_group, p, c.src_slot), n);
        at += n;
      }
      return;
    }
    for (uint32_t p = 0; p < pools; ++p) {
      std::memcpy(slot_bytes_at(c.dst_tier, c.pool_group, p, c.dst_slot),
                  slot_bytes_at(c.src_tier, c.pool_group, p, c.src_slot),
                  regions_.at(key(c.src_tier, c.pool_group, p)).slot_bytes);
    }
  }

  // A live state <-> reduced-precision snapshot copy, buffer by buffer.
  void run_converted(const SlotCopy& c) {
    for (const memory::ConvertSegment& seg :
         conversions_.at(conversion_key(c.pool_group, *c.dst_pool_group))) {
      const Region& src = regions_.at(key(c.src_tier, c.pool_group, seg.src_pool));
      const Region& dst = regions_.at(key(c.dst_tier, *c.dst_pool_group, seg.dst_pool));
      memory::convert(seg, dst.bytes.get() + c.dst_slot * dst.slot_bytes,
                      src.bytes.get() + c.src_slot * src.slot_bytes);
    }
  }

  // Regions are written once in allocate(), before any copy; the worker only reads the map.
  std::unordered_map<uint64_t, Region> regions_;
  std::unordered_map<uint32_t, uint32_t> pools_per_group_;
  std::unique_ptr<DiskStore> disk_;  // the DISK tier, when the plan has one
  // Segments of converted copies by (source pool group, destination pool group).
  ConversionTable conversions_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // work for the worker
  std::condition_variable done_cv_;  // completions for waiters
  std::deque<Batch> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::shared_ptr<Env> env_;  // runs each batch; the DISK tier's I/O
  std::thread worker_;
};

}  // namespace

std::unique_ptr<MemoryBackend> make_host_backend(std::shared_ptr<Env> env) {
  return std::make_unique<HostBackend>(std::move(env));
}

std::string disk_directory(const StoragePlan& plan) {
  for (const TierConfig& t : plan.config().tiers) {
    if (t.kind == TierKind::kDisk) return t.path;
  }
  return {};
}

int tier_position(const StoragePlan& plan, TierKind kind) {
  for (size_t t = 0; t < plan.tiers().size(); ++t) {
    if (plan.tiers()[t].kind == kind) return static_cast<int>(t);
  }
  return -1;
}

}  // namespace hybridkv::memory
