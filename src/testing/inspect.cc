#include "hybridkv/testing/inspect.h"

#include "cache/manager_core.h"

namespace hybridkv::testing {

const cache_detail::ManagerCore& ManagerInspector::core(const KvCacheManager& manager) {
  return *manager.core_;
}

std::string check_invariants(const KvCacheManager& manager) {
  return ManagerInspector::core(manager).check();
}

std::string debug_snapshot(const KvCacheManager& manager) {
  return ManagerInspector::core(manager).snapshot();
}

std::vector<TreePage> ManagerInspector::tree_pages(const cache_detail::ManagerCore& core) {
  std::shared_lock lock(core.mu_);
  std::vector<TreePage> out;
  const prefix::RadixTree& tree = core.index_.tree();
  tree.for_each_node([&](prefix::NodeId id, const prefix::Node& node) {
    const auto pages = tree.pages(id);
    for (uint32_t g = 0; g < pages.size(); ++g) {
      if (pages[g].page == storage::kNoPage) continue;
      const storage::Page& p = core.storage_.page(pages[g].page);
      out.push_back({node.key, CacheGroupId(g), p.tier, p.pool_group, p.slot.value,
                     pages[g].coverage, node.start, p.demoted, p.age_class});
    }
  });
  return out;
}

std::vector<TreePage> tree_pages(const KvCacheManager& manager) {
  return ManagerInspector::tree_pages(ManagerInspector::core(manager));
}

void set_copy_gate(KvCacheManager& manager, bool open) {
  ManagerInspector::core(manager).backend().set_copy_gate(open);
}

void set_disk_fault(KvCacheManager& manager, bool on) {
  ManagerInspector::core(manager).backend().set_disk_fault(on);
}

std::string InvariantChecker::check(const KvCacheManager& manager) {
  std::string err = check_invariants(manager);
  if (!err.empty()) return err;
  std::map<std::pair<BlockKey, uint32_t>, uint32_t> now;
  for (const TreePage& t : tree_pages(manager)) {
    const auto key = std::make_pair(t.key, t.group.value);
    const auto it = coverage_.find(key);
    if (it != coverage_.end() && t.coverage < it->second) {
      return "tree block of group " + std::to_string(t.group.value) + ": coverage shrank from " +
             std::to_string(it->second) + " to " + std::to_string(t.coverage);
    }
    now[key] = t.coverage;
  }
  coverage_ = std::move(now);
  return "";
}

}  // namespace hybridkv::testing
