// Eviction policies: which page a full (tier, pool group) gives up first (DESIGN §8: a policy
// has one home). A policy makes the queues of every (tier, pool group) and kind (HELD,
// DROPPABLE) and compares the heads of the two; Storage asks the queues for the next victim
// and does the moving, dropping and telling of owners itself. ManagerConfig::policies.eviction
// names the policy.
//
// Shipped (ranked_lru_policy.cc): "priced" (default), "snapshot-aware" and "lru". Adding one is
// one file that implements EvictionQueue and EvictionPolicy and a register_eviction_policy()
// call; tests/eviction_policy_test.cc does it with a policy of its own.
//
// A queue holds page ids only: Storage alone writes Page::queue (before push_back, after
// remove), and a queue may use the page's prev/next links while it holds the page.
// Thread-safety: the registry is safe from any thread; queues are used under the manager's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hybridkv/status.h"
#include "storage/page.h"

namespace hybridkv::storage {

class EvictionQueue {
 public:
  virtual ~EvictionQueue() = default;
  // Requires: the page is in no queue.
  virtual void push_back(PageId id) = 0;
  // Requires: the page is in this queue.
  virtual void remove(PageId id) = 0;
  // The next victim, or kNoPage.
  virtual PageId front() const = 0;
  // The next victim among pages that are not demoted, or kNoPage (the rebalancer's pressure).
  virtual PageId front_not_demoted() const = 0;
  virtual uint64_t size() const = 0;
  // Every page, the next victim first (for the checker and dumps).
  virtual std::vector<PageId> pages_in_order() const = 0;
  // The queue's own order invariant over pages_in_order(), or "" (the invariant checker).
  virtual std::string check_order() const { return ""; }
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string name() const = 0;
  // The verdicts of the prefix index the policy reads: demotion of tree pages no request can
  // resume from (Page::demoted), and snapshot prices (Page::age_class). The index computes
  // only what the policy reads.
  virtual bool uses_demotion() const = 0;
  virtual bool uses_prices() const = 0;
  // A queue of `kind` over `pages`; `clock` is the storage's tick (Page::lru_tick's clock).
  virtual std::unique_ptr<EvictionQueue> make_queue(PageTable* pages, QueueKind kind,
                                                    const uint64_t* clock) const = 0;
  // Of the heads of the HELD and the DROPPABLE queue, whether `a` goes before `b`.
  virtual bool evicted_before(const Page& a, const Page& b, uint64_t now) const = 0;
};

// The policy registered under `name`, or an error naming the field, the value and every name.
Result<const EvictionPolicy*> find_eviction_policy(std::string_view name);
std::vector<std::string> eviction_policy_names();
// Adds a policy (kAlreadyExists when the name is taken). Policies live until the process ends.
Status register_eviction_policy(std::unique_ptr<EvictionPolicy> policy);

}  // namespace hybridkv::storage
