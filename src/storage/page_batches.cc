// A cache operation's page changes, planned by the caller (cache/) and applied here in one call
// each (storage.h: add_refs, allocate_active, change_refs). Each applies its list in order
// through the single calls, so slots and queue order are the ones those calls would give.
#include "storage/storage.h"

namespace hybridkv::storage {

void Storage::add_refs(std::span<const PageId> pages, Ref ref) {
  for (PageId id : pages) add_ref(id, ref);
}

std::vector<PageId> Storage::allocate_active(std::span<const PageRequest> want) {
  std::vector<PageId> out;
  out.reserve(want.size());
  for (const PageRequest& r : want) {
    out.push_back(allocate(r.group, kGpuTier, r.priority));
    add_ref(out.back(), Ref::kActive);
  }
  return out;
}

void Storage::change_refs(std::span<const RefChange> changes) {
  for (const RefChange& c : changes) {
    if (c.to) {
      convert_ref(c.page, c.from, *c.to);
    } else {
      drop_ref(c.page, c.from);
    }
  }
}

}  // namespace hybridkv::storage
