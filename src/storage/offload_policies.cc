// The shipped offload admission policies.
//  - "selective" (default): a page the prefix index demoted (KV no snapshot can resume into, a
//    superseded snapshot) is dropped; every other page is copied down. Cost: O(1).
//  - "room": "selective" while the tier below is full; where it has a free slot a demoted page
//    is copied down all the same, since memory is not short (a superseded snapshot is still the
//    one a later branch may resume from). Cost: O(1), and the bus for demoted pages while there
//    is room below.
//  - "all": every evicted page that fits below is copied down. Cost: O(1), and the bus.
#include "storage/offload_policy.h"

namespace hybridkv::storage {
namespace {

class SelectiveOffload final : public OffloadPolicy {
 public:
  std::string name() const override { return "selective"; }
  bool admit(const Page& page, const RoomBelow&) const override { return !page.demoted; }
};

class RoomOffload final : public OffloadPolicy {
 public:
  std::string name() const override { return "room"; }
  bool admit(const Page& page, const RoomBelow& below) const override {
    return !page.demoted || below.free > 0;
  }
};

class OffloadAll final : public OffloadPolicy {
 public:
  std::string name() const override { return "all"; }
  bool admit(const Page&, const RoomBelow&) const override { return true; }
};

}  // namespace

std::vector<std::unique_ptr<OffloadPolicy>> shipped_offload_policies() {
  std::vector<std::unique_ptr<OffloadPolicy>> out;
  out.push_back(std::make_unique<SelectiveOffload>());
  out.push_back(std::make_unique<OffloadAll>());
  out.push_back(std::make_unique<RoomOffload>());
  return out;
}

}  // namespace hybridkv::storage
