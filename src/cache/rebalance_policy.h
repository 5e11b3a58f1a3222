// Rebalancing policies: how the pool groups of one tier trade slots while serving (one budget
// per tier). ManagerConfig::policies.rebalance names the policy; "off" (no policy) keeps the
// split the plan started from. The manager gathers what a policy sees of a tier (PoolPressure
// per pool group), asks it for new slot counts, checks them against every constraint and
// applies them, or changes nothing.
//
// Shipped (pressure_rebalance.cc): "pressure". Adding one is one file that implements
// RebalancePolicy and a register_rebalance_policy() call.
// Thread-safety: the registry is safe from any thread; target() runs under the manager's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hybridkv/plan.h"

namespace hybridkv::cache_detail {

// One pool group of the tier, as the policy sees it.
struct PoolPressure {
  PoolGroupId id;
  uint64_t slots = 0;  // now
  uint64_t slot_bytes = 0;
  uint64_t free = 0;       // free slots
  uint64_t floor = 0;      // the fewest slots it may keep (GPU: what the constraints need)
  uint64_t age = 0;        // Storage::pressure_age: how long its next victim of value waited
  uint64_t victims = 0;    // evictions of pages of value since the last step
  uint64_t wants = 0;      // Storage::wants: pages dropped above for want of a free slot here
  bool ever_full = false;  // it ever evicted a page of value (Storage::ever_full)
  bool traded = false;     // it may trade slots (shared KV and snapshot pool groups)
};

class RebalancePolicy {
 public:
  virtual ~RebalancePolicy() = default;
  virtual std::string name() const = 0;
  // New slot counts per pool group (by id) for a tier of `quota` bytes, or nullopt to leave it
  // as it is. Counts of groups that may not trade must stay; the manager checks the rest.
  virtual std::optional<std::vector<uint64_t>> target(
      uint64_t quota, std::span<const PoolPressure> pools) const = 0;
  // Whether target() could move anything, judged from the counts alone: the pools' ages are
  // not filled in (0). The manager asks before it measures them (Storage::pressure_age walks
  // a queue's ranks), which need_adjustment does every step. Default: always.
  virtual bool pressed(std::span<const PoolPressure> /*pools*/) const { return true; }
};

// nullptr for "off"; an error naming the field, the value and every name for an unknown one.
Result<const RebalancePolicy*> find_rebalance_policy(std::string_view name);
Status register_rebalance_policy(std::unique_ptr<RebalancePolicy> policy);

}  // namespace hybridkv::cache_detail
