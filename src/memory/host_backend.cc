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
// missing wait shows up as a wrong byte in CPU tests. Several ranks: each its own pools and DISK
// files, every copy applied to each.
class HostBackend final : public MemoryBackend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  HostBackend(std::shared_ptr<Env> env, size_t ranks)
      : ranks_(static_cast<uint32_t>(ranks)), env_(env ? std::move(env) : Env::system()) {
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

  uint32_t ranks() const override { return ranks_; }

  Status allocate(const StoragePlan& plan) override {
    for (uint32_t rank = 0; rank < ranks_; ++rank) {
      if (Status s = allocate_rank(plan, rank); !s) return s;
    }
    conversions_ = conversion_table(plan);
    return Status::ok();
  }

  Status allocate_rank(const StoragePlan& plan, uint32_t rank) {
    for (uint32_t t = 0; t < plan.tiers().size(); ++t) {
      const TierPlan& tier = plan.tiers()[t];
      if (tier.kind == TierKind::kDisk) {
        Result<std::unique_ptr<DiskStore>> disk =
            DiskStore::open(disk_directory(plan), plan, t, env_);
        if (!disk) return disk.status();
        disks_.push_back(std::move(disk).value());
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
          regions_[pool_key(tier.kind, pg.id, p, rank)] = std::move(region);
          pools_per_group_[pg.id.value] = static_cast<uint32_t>(pg.pools.size());
        }
      }
    }
    return Status::ok();
  }

  std::byte* pool_base(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t rank) const override {
    auto it = regions_.find(pool_key(tier, pg, pool, rank));
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

  Status copy_status() const override {
    for (const auto& disk : disks_) {
      if (Status s = disk->status(); !s) return s;
    }
    return Status::ok();
  }

 private:
  struct FreeBytes {
    void operator()(std::byte* p) const { std::free(p); }
  };
  struct Region {
    std::unique_ptr<std::byte, FreeBytes> bytes;
    uint64_t slot_bytes = 0;
  };
  using Batch = QueuedBatch;

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
    for (uint32_t rank = 0; rank < ranks_; ++rank) execute(batch.copies, rank);
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_ = batch.ticket;
    }
    done_cv_.notify_all();
  }

  void execute(std::span<const SlotCopy> copies, uint32_t rank) {
    for_each_run(
        copies,
        [&](size_t first, size_t last) {
          for (size_t i = first; i < last; ++i) run_memory(copies[i], rank);
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
                                       to_disk ? c.src_slot : c.dst_slot, rank);
                },
                ops);
          }
          disks_.at(rank)->run(ops);
        });
  }

  std::byte* slot_bytes_at(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t slot,
                           uint32_t rank) const {
    const Region& r = region(tier, pg, pool, rank);
    return r.bytes.get() + slot * r.slot_bytes;
  }
  const Region& region(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t rank) const {
    return regions_.at(pool_key(tier, pg, pool, rank));
  }

  void run_memory(const SlotCopy& c, uint32_t rank) {
    if (c.cancelled) return;
    if (c.dst_pool_group) {
      run_converted(c, rank);
      return;
    }
    const uint32_t pools = pools_per_group_.at(c.pool_group.value);
    if (c.dst_host != nullptr) {  // the slot's pools, one after the other, into host memory
      if (rank != 0) return;      // one rank only: the shared tier is refused with several
      std::byte* at = c.dst_host;
      for (uint32_t p = 0; p < pools; ++p) {
        const uint64_t n = region(c.src_tier, c.pool_group, p, rank).slot_bytes;
        std::memcpy(at, slot_bytes_at(c.src_tier, c.pool_group, p, c.src_slot, rank), n);
        at += n;
      }
      return;
    }
    for (uint32_t p = 0; p < pools; ++p) {
      std::memcpy(slot_bytes_at(c.dst_tier, c.pool_group, p, c.dst_slot, rank),
                  slot_bytes_at(c.src_tier, c.pool_group, p, c.src_slot, rank),
                  region(c.src_tier, c.pool_group, p, rank).slot_bytes);
    }
  }

  // A live state <-> reduced-precision snapshot copy, buffer by buffer.
  void run_converted(const SlotCopy& c, uint32_t rank) {
    for (const memory::ConvertSegment& seg :
         conversions_.at(conversion_key(c.pool_group, *c.dst_pool_group))) {
      const Region& src = region(c.src_tier, c.pool_group, seg.src_pool, rank);
      const Region& dst = region(c.dst_tier, *c.dst_pool_group, seg.dst_pool, rank);
      memory::convert(seg, dst.bytes.get() + c.dst_slot * dst.slot_bytes,
                      src.bytes.get() + c.src_slot * src.slot_bytes);
    }
  }

  // Regions are written once in allocate(), before any copy; the worker only reads the map.
  std::unordered_map<uint64_t, Region> regions_;
  std::unordered_map<uint32_t, uint32_t> pools_per_group_;
  uint32_t ranks_ = 1;
  std::vector<std::unique_ptr<DiskStore>> disks_;  // the DISK tier per rank, when the plan has one
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

std::unique_ptr<MemoryBackend> make_host_backend(std::shared_ptr<Env> env, size_t ranks) {
  return std::make_unique<HostBackend>(std::move(env), ranks);
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
