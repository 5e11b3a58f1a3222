#include "hybridkv/testing/inspect.h"

#include "cache/manager_core.h"

namespace hybridkv::testing {

namespace {

const cache_detail::ManagerCore& core(const KvCacheManager& manager) {
  return cache_detail::CoreAccess::of(manager);
}

}  // namespace

std::string check_invariants(const KvCacheManager& manager) {
  return core(manager).reads().check();
}

std::string debug_snapshot(const KvCacheManager& manager) {
  return core(manager).reads().snapshot();
}

std::vector<TreePage> tree_pages(const KvCacheManager& manager) {
  std::vector<TreePage> out;
  core(manager).reads().read_locked(
      [&](const storage::Storage& storage, const prefix::PrefixIndex& index) {
        const prefix::RadixTree& tree = index.tree();
        tree.for_each_node([&](prefix::NodeId id, const prefix::Node& node) {
          const auto pages = tree.pages(id);
          for (uint32_t g = 0; g < pages.size(); ++g) {
            if (pages[g].page == storage::kNoPage) continue;
            const storage::Page& p = storage.page(pages[g].page);
            out.push_back({node.key, CacheGroupId(g), p.tier, p.pool_group, p.slot.value,
                           pages[g].coverage, node.start, p.demoted, p.age_class});
          }
        });
      });
  return out;
}

void read_pool_bytes(const KvCacheManager& manager, void* dst, const std::byte* src, size_t n) {
  core(manager).backend().read_bytes(dst, src, n);
}
void write_pool_bytes(const KvCacheManager& manager, std::byte* dst, const void* src, size_t n) {
  core(manager).backend().write_bytes(dst, src, n);
}
void read_pool_bytes(const KvCacheManager& manager, std::span<const PoolTransfer> transfers) {
  core(manager).backend().read_many(transfers);
}
void write_pool_bytes(const KvCacheManager& manager, std::span<const PoolTransfer> transfers) {
  core(manager).backend().write_many(transfers);
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
