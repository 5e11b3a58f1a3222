// The shipped rebalancing policy, "pressure" (ManagerConfig::policies.rebalance).
//
// Rule, one budget per tier (issue 12 item 3): the pool groups of
// a tier trade slots while serving, so that no fixed split (the typical step's) decides how many
// snapshots and how many KV pages are kept.
//
// The rule is one LRU over the tier's bytes: under it, the page every pool group would give up
// first would have waited equally long. Storage::pressure_age measures that wait, weighted by
// the page's age class (snapshot pricing prices a snapshot against KV there); demoted pages,
// which are worth nothing, do not count. The receiver is the youngest-victim pool group among
// those under pressure (at least kMinVictims evictions since the last step); the donor is
// the pool group, among those that can give the step's bytes, whose oldest page has waited
// longest, where one that never evicted a page of value and can give the step from its free
// slots counts as infinitely old (slots never needed are worth nothing, however young its
// pages). When the donor's wait is at least kHysteresis times the receiver's, about
// 1/kStepDivisor of the tier moves from the one to the other. A step that cannot be taken
// (LOCKED pages, GPU floors, reserved slots) is skipped: it changes nothing. On the GPU no pool
// group goes below its floor: what the declared constraints need (the hybrid manager declares
// one request of ServingConfig::max_seq_len).
//
// Measured on the conversation trace (bench/RESULTS.md, 2026-12-01, later): choosing the donor
// among the pool groups that can give and the receiver among those under pressure (before, an
// idle pool group too small to give, or one with no slot, stopped every step on its tier), and
// judging idle pool groups by their oldest page, took Nemotron-H at GPU 40 + host 200 GiB with
// fp8 snapshots from 0.897 to 0.913 of attention-only reuse and Qwen3-Next at 16 + 64 GiB from
// 0.817 to 0.858, and made the starting split (--typical-len) matter little. Counting the free
// slots of a pool group that never evicted a page of value as worth nothing (2026-12-01, sixth
// session) made it matter less where the split starts far off: fp8, 16 + 64 GiB, --typical-len
// 65536, Nemotron-H 0.748 -> 0.836 and Qwen3-Next 0.859 -> 0.899 (at the default 8192
// Nemotron-H 0.855 -> 0.852). Counting every free slot so (tried) shrank the GPU's state pool
// group to its floor on the demo's slice (live states free theirs all the time) and cost it
// 14 %. Snapshots' waits are no longer divided by 2: snapshot pricing weighs them, and the
// extra weight now cost the demo's slice 8 %.
//
// A pool group that never evicted a page of value can still be short: pages dropped above for
// want of a free slot in it (Storage::wants; the "room" offload policy copies superseded
// snapshots down only into free slots) are pressure too, but only against slots no other pool
// group ever needed: memory that is not short (issue 35: with 8,000 GiB of host, the fixed host
// split dropped 16.8 M tokens' snapshots on the conversation trace with periodic:512).
//
// Cost: O(pool groups) per tier per step.
#include <algorithm>

#include "cache/rebalance_policy.h"
#include "util/registry.h"

namespace hybridkv::cache_detail {
namespace {

constexpr double kHysteresis = 1.5;
constexpr uint64_t kMinVictims = 16;
constexpr uint64_t kStepDivisor = 128;

class PressureRebalance final : public RebalancePolicy {
 public:
  std::string name() const override { return "pressure"; }

  std::optional<std::vector<uint64_t>> target(uint64_t quota,
                                              std::span<const PoolPressure> pools) const override {
    // Evictions of value first; failing them, pages dropped above for want of a slot here,
    // which may only take slots no other pool group ever needed.
    if (auto want = step(quota, pools, &PoolPressure::victims, false)) return want;
    return step(quota, pools, &PoolPressure::wants, true);
  }

  // step() moves slots only toward a receiver of either pressure.
  bool pressed(std::span<const PoolPressure> pools) const override {
    return std::any_of(pools.begin(), pools.end(), [](const PoolPressure& p) {
      return receiver(p, &PoolPressure::victims) || receiver(p, &PoolPressure::wants);
    });
  }

 private:
  // A pool group that may take slots under `pressure`: traded, with kMinVictims of it.
  static bool receiver(const PoolPressure& p, uint64_t PoolPressure::*pressure) {
    return p.traded && p.*pressure >= kMinVictims;
  }

  static std::optional<std::vector<uint64_t>> step(uint64_t quota,
                                                   std::span<const PoolPressure> pools,
                                                   uint64_t PoolPressure::*pressure,
                                                   bool unneeded_only) {
    std::vector<uint64_t> want, age;
    uint64_t used = 0;
    std::optional<size_t> to;
    for (size_t i = 0; i < pools.size(); ++i) {
      const PoolPressure& p = pools[i];
      want.push_back(p.slots);
      used += p.slots * p.slot_bytes;
      age.push_back(p.age);
      if (!receiver(p, pressure)) continue;
      if (!to || age.back() < age[*to]) to = i;
    }
    if (!to) return std::nullopt;
    const uint64_t gain = std::max<uint64_t>(1, quota / kStepDivisor / pools[*to].slot_bytes);
    const uint64_t spare = quota > used ? quota - used : 0;
    const uint64_t gain_bytes = gain * pools[*to].slot_bytes;
    const uint64_t need = gain_bytes > spare ? gain_bytes - spare : 0;
    std::optional<size_t> from;
    uint64_t loss = 0;
    for (size_t i = 0; i < pools.size(); ++i) {
      const PoolPressure& p = pools[i];
      if (i == *to || !p.traded) continue;
      const uint64_t slots = (need + p.slot_bytes - 1) / p.slot_bytes;
      if (want[i] < p.floor + slots) continue;
      // Slots never needed are worth nothing (Storage::ever_full).
      if (!p.ever_full && p.free >= slots) age[i] = UINT64_MAX;
      if (!from || age[i] >= age[*from]) from = i, loss = slots;
    }
    if (!from) return std::nullopt;
    if (unneeded_only ? age[*from] != UINT64_MAX
                      : age[*from] != UINT64_MAX && static_cast<double>(age[*from]) <
                                                        kHysteresis * static_cast<double>(age[*to]))
      return std::nullopt;
    want[*from] -= loss;
    want[*to] += gain;
    return want;
  }
};

Registry<RebalancePolicy>& rebalancers() {
  static auto* r = [] {
    std::vector<std::unique_ptr<RebalancePolicy>> shipped;
    shipped.push_back(std::make_unique<PressureRebalance>());
    return new Registry<RebalancePolicy>("policies.rebalance", std::move(shipped));
  }();
  return *r;
}

}  // namespace

Result<const RebalancePolicy*> find_rebalance_policy(std::string_view name) {
  if (name == "off") return static_cast<const RebalancePolicy*>(nullptr);
  return rebalancers().find(name);
}

Status register_rebalance_policy(std::unique_ptr<RebalancePolicy> policy) {
  return rebalancers().add(std::move(policy));
}

}  // namespace hybridkv::cache_detail
