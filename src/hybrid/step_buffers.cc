// HybridCacheManager's step buffers: sized once, at fixed addresses, one copy per step.
#include <algorithm>
#include <cstring>

#include "cache/manager_core.h"
#include "hybrid/step_state.h"
#include "hybridkv/units.h"

namespace hybridkv {
namespace {

// The widest block table a request of this serving config can have.
Result<uint64_t> max_blocks_for(const KvCacheManager& m, const ServingConfig& serving) {
  const uint32_t tpb = m.plan().config().tokens_per_block;
  uint64_t tokens = serving.max_seq_len.value_or(UINT64_MAX);
  if (!serving.max_seq_len) {
    const uint64_t gpu = m.plan().config().tiers.front().quota_bytes;
    Result<uint64_t> longest = clamp_max_seq_len_for_mem(m.plan().config(), gpu, UINT64_MAX);
    if (!longest) return longest.status();
    tokens = *longest;
  }
  if (tokens == UINT64_MAX || tokens == 0) {
    return Status::invalid("step_buffers: no bound on a request's length: set max_seq_len");
  }
  const uint64_t blocks = (tokens + tpb - 1) / tpb;
  if (blocks > UINT32_MAX) {
    return Status::invalid("step_buffers: max_seq_len " + std::to_string(tokens) +
                           " gives more than 2^32 blocks per request");
  }
  return blocks;
}

}  // namespace

Result<const HybridCacheManager::StepBuffers*> HybridCacheManager::step_buffers(uint32_t rank) {
  if (rank >= manager_->ranks()) {
    return Status::invalid("step_buffers: rank " + std::to_string(rank) + " but the manager has " +
                           std::to_string(manager_->ranks()));
  }
  if (step_states_.size() <= rank) step_states_.resize(manager_->ranks());
  if (step_states_[rank]) return &step_states_[rank]->view;
  Result<uint64_t> blocks = max_blocks_for(*manager_, serving_);
  if (!blocks) return blocks.status();
  StepBuffers v;
  v.capacity = serving_.max_batch + serving_.dummy_slots;
  v.max_blocks = static_cast<uint32_t>(*blocks);
  for (const CacheGroup& g : plan().cache_groups()) {
    if (g.kind != GroupKind::kSsm) v.table_groups.push_back(g.id);
  }
  v.row_stride = uint64_t{v.max_blocks} * v.table_groups.size();
  const uint64_t ints = 2 * uint64_t{v.capacity} + v.capacity * v.row_stride;
  Result<std::unique_ptr<memory::StepArea>> area =
      cache_detail::CoreAccess::of(*manager_).backend().make_step_area(ints * sizeof(int32_t),
                                                                       rank);
  if (!area) return area.status();
  auto state = std::make_unique<StepState>();
  state->area = std::move(area).value();
  const auto* base = reinterpret_cast<const int32_t*>(state->area->data());
  v.state_indices = base;
  v.replay_indices = base + v.capacity;
  v.block_tables = base + 2 * uint64_t{v.capacity};
  v.on_device = state->area->on_device();
  state->view = std::move(v);
  state->width.assign(uint64_t{state->view.capacity} * state->view.table_groups.size(), 0);
  step_states_[rank] = std::move(state);
  return &step_states_[rank]->view;
}

Status HybridCacheManager::fill_step(const Step& step, Stream stream, uint32_t rank) {
  Result<const StepBuffers*> got = step_buffers(rank);
  if (!got) return got.status();
  const StepBuffers& v = **got;
  const size_t n = step.entries.size();
  if (n > v.capacity) {
    return Status::invalid("fill_step: " + std::to_string(n) +
                           " entries but the step buffers hold " + std::to_string(v.capacity) +
                           " (max_batch + dummy_slots)");
  }
  // Each entry's cache: requests by id, then the dummies in order.
  std::vector<const KvCache*> caches(n);
  size_t dummy = 0;
  for (size_t e = 0; e < n; ++e) {
    const std::optional<uint64_t>& id = step.entries[e].request_id;
    caches[e] = id ? cache(*id) : dummies_.at(dummy++).get();
    if (caches[e] == nullptr) return Status::not_found("fill_step: request " + std::to_string(*id));
    for (CacheGroupId g : v.table_groups) {
      const size_t width = caches[e]->block_table(g)->size();
      if (width > v.max_blocks) {
        return Status::invalid(
            "fill_step: " + (id ? "request " + std::to_string(*id) : std::string("a dummy")) +
            " has " + std::to_string(width) + " blocks in group " + std::to_string(g.value) +
            ", wider than max_blocks " + std::to_string(v.max_blocks) + " (raise max_seq_len)");
      }
    }
  }
  StepState& s = *step_states_[rank];
  auto* out = reinterpret_cast<int32_t*>(s.area->staging());
  int32_t* tables = out + 2 * uint64_t{v.capacity};
  for (size_t e = 0; e < v.capacity; ++e) {
    out[e] = e < n ? step.entries[e].state_index : kBadPageIndex;
    out[v.capacity + e] = e < n ? step.entries[e].replay_index : kBadPageIndex;
    for (size_t k = 0; k < v.table_groups.size(); ++k) {
      int32_t* row = tables + e * v.row_stride + k * uint64_t{v.max_blocks};
      uint32_t& was = s.width[e * v.table_groups.size() + k];
      std::span<const int32_t> t;
      if (e < n) t = *caches[e]->block_table(v.table_groups[k]);
      std::copy(t.begin(), t.end(), row);
      if (was > t.size()) std::fill(row + t.size(), row + was, kBadPageIndex);
      was = static_cast<uint32_t>(t.size());
    }
  }
  // One copy: the index arrays and every row up to the last entry of this step or the previous
  // one (whose rows past this step become -1).
  const uint64_t ints = 2 * uint64_t{v.capacity} + std::max(n, s.last_entries) * v.row_stride;
  s.last_entries = n;
  return s.area->upload(ints * sizeof(int32_t), stream);
}

}  // namespace hybridkv
