// Offload admission: whether a DROPPABLE page evicted from a tier with room below is copied
// down (or goes back to the copy it kept there) or dropped. A HELD page always moves: a
// suspended cache needs it. ManagerConfig::policies.offload names the policy.
//
// Shipped (offload_policies.cc): "selective" (default), "all" and "room". Adding one is one file
// that implements OffloadPolicy and a register_offload_policy() call. Thread-safety: the registry
// is safe from any thread; admit() runs under the manager's lock.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hybridkv/status.h"
#include "storage/page.h"

namespace hybridkv::storage {

// The slots of the page's pool group on the tier it would go to (or where its copy is).
struct RoomBelow {
  uint64_t free = 0;  // free now: taking one evicts nothing there
  uint64_t total = 0;
};

class OffloadPolicy {
 public:
  virtual ~OffloadPolicy() = default;
  virtual std::string name() const = 0;
  // The DROPPABLE page `page` is worth a copy down the tiers (or keeping its copy there).
  virtual bool admit(const Page& page, const RoomBelow& below) const = 0;
};

Result<const OffloadPolicy*> find_offload_policy(std::string_view name);
std::vector<std::string> offload_policy_names();
Status register_offload_policy(std::unique_ptr<OffloadPolicy> policy);

}  // namespace hybridkv::storage
