// The policy registries: the shipped policies, then any an embedder or a test registers.
#include "storage/eviction_policy.h"
#include "storage/offload_policy.h"
#include "util/registry.h"

namespace hybridkv::storage {

std::vector<std::unique_ptr<EvictionPolicy>> shipped_eviction_policies();
std::vector<std::unique_ptr<OffloadPolicy>> shipped_offload_policies();

namespace {

Registry<EvictionPolicy>& evictions() {
  static auto* r = new Registry<EvictionPolicy>("policies.eviction", shipped_eviction_policies());
  return *r;
}

Registry<OffloadPolicy>& offloads() {
  static auto* r = new Registry<OffloadPolicy>("policies.offload", shipped_offload_policies());
  return *r;
}

}  // namespace

Result<const EvictionPolicy*> find_eviction_policy(std::string_view name) {
  return evictions().find(name);
}
std::vector<std::string> eviction_policy_names() { return evictions().names(); }
Status register_eviction_policy(std::unique_ptr<EvictionPolicy> policy) {
  return evictions().add(std::move(policy));
}

Result<const OffloadPolicy*> find_offload_policy(std::string_view name) {
  return offloads().find(name);
}
std::vector<std::string> offload_policy_names() { return offloads().names(); }
Status register_offload_policy(std::unique_ptr<OffloadPolicy> policy) {
  return offloads().add(std::move(policy));
}

}  // namespace hybridkv::storage
