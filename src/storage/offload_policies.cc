// The shipped offload admission policies.
//  - "selective" (default): a page the prefix index demoted (KV no snapshot can resume into, a
//    superseded snapshot) is dropped; every other page is copied down. Cost: O(1).
//  - "all": every evicted page that fits below is copied down. Cost: O(1), and the bus.
#include "storage/offload_policy.h"

namespace hybridkv::storage {
namespace {

class SelectiveOffload final : public OffloadPolicy {
 public:
  std::string name() const override { return "selective"; }
  bool admit(const Page& page) const override { return !page.demoted; }
};

class OffloadAll final : public OffloadPolicy {
 public:
  std::string name() const override { return "all"; }
  bool admit(const Page&) const override { return true; }
};

}  // namespace

std::vector<std::unique_ptr<OffloadPolicy>> shipped_offload_policies() {
  std::vector<std::unique_ptr<OffloadPolicy>> out;
  out.push_back(std::make_unique<SelectiveOffload>());
  out.push_back(std::make_unique<OffloadAll>());
  return out;
}

}  // namespace hybridkv::storage
