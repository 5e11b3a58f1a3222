#include "storage/room.h"

namespace hybridkv::storage {

void make_room(Storage& storage, TierIndex tier, PoolGroupId pg, uint64_t n, PageOwner& owner) {
  while (const std::optional<Eviction> e = storage.next_eviction(tier, pg, n)) {
    if (e->action == Eviction::Action::kMoveDown) {
      storage.pin(e->victim);
      make_room(storage, e->below, pg, 1, owner);
      storage.unpin(e->victim);
    } else if (e->action == Eviction::Action::kDrop) {
      const Page& v = storage.page(e->victim);
      owner.page_dropping(e->victim, v.owner, v.group);
    }
    storage.evict(*e);
    deliver_notices(storage, owner);
  }
}

void deliver_notices(Storage& storage, PageOwner& owner) {
  if (!storage.has_notices()) return;
  owner.pages_updated(storage.notices());
  storage.clear_notices();
}

}  // namespace hybridkv::storage
