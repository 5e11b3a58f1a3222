// The engine backend: the engine owns the pools and runs the copies (hybridkv/engine_memory.h).
// Submitted batches wait in a queue until the engine takes them, as lists of consecutive copies
// between one pair of tiers and pool groups; a copy is cancellable until its batch is taken.
// wait() lets an attached EngineMemory run copies on the waiting thread, then blocks until the
// engine reports the event done.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_set>

#include "hybridkv/engine_memory.h"
#include "memory/backends.h"
#include "util/check.h"

namespace hybridkv::memory {
namespace {

// The lists of one batch: a new list where the tiers or pool groups change, or, within one tier
// and pool group, where a copy would read a slot an earlier copy of the list writes or write a
// slot an earlier copy reads (so an engine may run a list's copies in any order).
std::vector<EngineCopyList> copy_lists(const std::vector<uint64_t>& slot_bytes,
                                       std::span<const SlotCopy> copies) {
  std::vector<EngineCopyList> lists;
  std::unordered_set<uint32_t> read, written;  // slots of the current list (same-tier lists)
  for (const SlotCopy& c : copies) {
    if (c.cancelled) continue;
    const PoolGroupId dst_pg = c.dst_pool_group.value_or(c.pool_group);
    EngineCopyList* last = lists.empty() ? nullptr : &lists.back();
    const bool same = last != nullptr && last->src_tier == c.src_tier &&
                      last->dst_tier == c.dst_tier && last->src_pool_group == c.pool_group &&
                      last->dst_pool_group == dst_pg;
    const bool one_memory = c.src_tier == c.dst_tier && c.pool_group == dst_pg;
    const bool hazard =
        one_memory && (written.count(c.src_slot) != 0 || read.count(c.dst_slot) != 0);
    if (!same || hazard) {
      lists.push_back(
          {c.src_tier, c.dst_tier, c.pool_group, dst_pg, slot_bytes[c.pool_group.value], {}, {}});
      read.clear();
      written.clear();
      last = &lists.back();
    }
    last->src_slots.push_back(c.src_slot);
    last->dst_slots.push_back(c.dst_slot);
    if (one_memory) {
      read.insert(c.src_slot);
      written.insert(c.dst_slot);
    }
  }
  return lists;
}

class EngineBackend final : public MemoryBackend, public EngineCopyQueue {
 public:
  explicit EngineBackend(std::shared_ptr<EngineMemory> engine) : engine_(std::move(engine)) {}

  BackendKind kind() const override { return BackendKind::kEngine; }

  Status allocate(const StoragePlan& plan) override {
    for (const PoolGroup& pg : plan.pool_groups()) slot_bytes_.push_back(pg.slot_bytes);
    return engine_ ? engine_->attach(plan, *this) : Status::ok();
  }

  std::byte* pool_base(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t rank) const override {
    return engine_ && rank == 0 ? engine_->pool_base(tier, pg, pool) : nullptr;
  }

  CopyEvent submit(std::vector<SlotCopy> batch) override {
    if (batch.empty()) return {};
    for (const SlotCopy& c : batch) {
      HKV_CHECK(c.dst_host == nullptr, "the engine backend copies only between pool slots");
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({++submitted_, std::move(batch)});
    return {submitted_};
  }

  void wait(CopyEvent event) override {
    uint64_t ticket;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ticket = std::min(event.ticket, submitted_);  // a future ticket: all so far
      if (done_ >= ticket) return;
    }
    if (engine_) engine_->on_wait({ticket});
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_ >= ticket; });
  }

  bool cancel(CopyEvent event, uint32_t index) override {
    std::lock_guard<std::mutex> lock(mu_);
    return cancel_queued(queue_, event, index);  // a batch the engine took is not cancelled
  }

  Status copy_status() const override { return engine_ ? engine_->copy_status() : Status::ok(); }

  std::vector<EngineCopyBatch> take() override {
    std::deque<QueuedBatch> taken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      taken.swap(queue_);
    }
    std::vector<EngineCopyBatch> out;
    out.reserve(taken.size());
    for (const QueuedBatch& q : taken)
      out.push_back({{q.ticket}, copy_lists(slot_bytes_, q.copies)});
    return out;
  }

  Status done(CopyEvent event) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (event.ticket > submitted_) {
        return Status::invalid("copies_done: event " + std::to_string(event.ticket) +
                               " was never submitted (the last is " + std::to_string(submitted_) +
                               ")");
      }
      done_ = std::max(done_, event.ticket);
    }
    done_cv_.notify_all();
    return Status::ok();
  }

 private:
  const std::shared_ptr<EngineMemory> engine_;
  std::vector<uint64_t> slot_bytes_;  // per pool group (allocate)
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<QueuedBatch> queue_;  // submitted, not taken yet
  uint64_t submitted_ = 0;
  uint64_t done_ = 0;
};

}  // namespace

std::unique_ptr<MemoryBackend> make_engine_backend(std::shared_ptr<EngineMemory> engine) {
  return std::make_unique<EngineBackend>(std::move(engine));
}

}  // namespace hybridkv::memory
