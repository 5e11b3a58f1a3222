// HostEngine (hybridkv/testing/host_engine.h): the engine's pools are a host backend's, and each
// list handed out is turned back into slot copies for that backend's copy engine.
#include "hybridkv/testing/host_engine.h"

#include <utility>

#include "memory/backends.h"

namespace hybridkv::testing {

HostEngine::HostEngine(std::shared_ptr<Env> env) : env_(std::move(env)) {}
HostEngine::~HostEngine() = default;

Status HostEngine::attach(const StoragePlan& plan, EngineCopyQueue& queue) {
  if (queue_ != nullptr) {
    return Status(StatusCode::kFailedPrecondition,
                  "HostEngine: already attached to a manager (one HostEngine per manager)");
  }
  std::unique_ptr<memory::MemoryBackend> memory = memory::make_host_backend(env_);
  if (Status s = memory->allocate(plan); !s) return s;
  memory_ = std::move(memory);
  queue_ = &queue;
  return Status::ok();
}

std::byte* HostEngine::pool_base(TierKind tier, PoolGroupId pool_group, uint32_t pool) const {
  return memory_ ? memory_->pool_base(tier, pool_group, pool, 0) : nullptr;
}

void HostEngine::on_wait(CopyEvent) { run(); }

Status HostEngine::copy_status() const { return memory_ ? memory_->copy_status() : Status::ok(); }

uint64_t HostEngine::run() {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_ == nullptr) return 0;
  const std::vector<EngineCopyBatch> batches = queue_->take();
  for (const EngineCopyBatch& batch : batches) {
    for (const EngineCopyList& list : batch.lists) {
      std::vector<memory::SlotCopy> copies;
      for (size_t i = 0; i < list.src_slots.size(); ++i) {
        memory::SlotCopy c;
        c.pool_group = list.src_pool_group;
        if (list.dst_pool_group != list.src_pool_group) c.dst_pool_group = list.dst_pool_group;
        c.src_tier = list.src_tier;
        c.src_slot = list.src_slots[i];
        c.dst_tier = list.dst_tier;
        c.dst_slot = list.dst_slots[i];
        copies.push_back(c);
      }
      counts_.copies += copies.size();
      // One list at a time, each complete before the next: the order the lists promise, and
      // nothing more.
      memory_->wait(memory_->submit(std::move(copies)));
      ++counts_.lists;
    }
    (void)queue_->done(batch.event);
    ++counts_.batches;
    if (record_) ran_.push_back(batch);
  }
  return batches.size();
}

void HostEngine::record(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  record_ = on;
}

std::vector<EngineCopyBatch> HostEngine::take_ran() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(ran_, {});
}

HostEngine::Counts HostEngine::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace hybridkv::testing
