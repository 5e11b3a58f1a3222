// The shared tier's publishing side (DESIGN §8a): what a commit sends, and the bytes of a page.
//
// What is worth sharing: for a hybrid model, KV is worth something to another instance only up
// to a snapshot it can resume from, so a commit that publishes a snapshot at a full block sends
// it and the KV chain above it (every node up to the first one already sent); KV committed
// without a snapshot waits for one. An attention-only model sends every full block it commits.
// Partial blocks are never sent (another instance's prompt rarely ends at the same token).
#include "cache/manager_core.h"
#include "cache/shared_tier.h"

namespace hybridkv::cache_detail {

SharedLink::SharedLink(ManagerCore& core) : core_(core) {
  const StoragePlan& plan = core.plan_;
  if (plan.config().shared.store)
    shared_ = std::make_unique<SharedTier>(plan, plan.config().shared, *core.backend_);
}

using prefix::kNoNode;
using prefix::NodeId;

bool SharedLink::has_recurrent_groups() const {
  for (const CacheGroup& g : core_.plan_.cache_groups()) {
    if (publishable(g) && g.kind == GroupKind::kSsm) return true;
  }
  return false;
}

bool SharedLink::readable(PageId page) const {
  const storage::Page& p = core_.storage_.page(page);
  return p.tier != TierKind::kDisk &&
         core_.backend_->pool_base(p.tier, p.pool_group, 0, 0) != nullptr;
}

std::vector<PoolTransfer> SharedLink::slot_transfers(PageId page, std::byte* host) const {
  const storage::Page& p = core_.storage_.page(page);
  const PoolGroup& pg = core_.plan_.pool_group(p.pool_group);
  std::vector<PoolTransfer> out;
  for (uint32_t k = 0; k < pg.pools.size(); ++k) {
    std::byte* base = core_.backend_->pool_base(p.tier, p.pool_group, k, 0);
    if (base == nullptr) return {};  // not in memory (a DISK page, or no bytes at all)
    out.push_back({base + p.slot.value * pg.pools[k].slot_bytes, host, pg.pools[k].slot_bytes});
    host += pg.pools[k].slot_bytes;
  }
  return out;
}

// Requires core_.mu_ (exclusive). `blocks`: full nodes this commit published KV at; `snapshot`: the
// node it published snapshots at (kNoNode: none).
void SharedLink::publish(const std::vector<NodeId>& blocks, NodeId snapshot) {
  if (!shared_) return;
  const prefix::RadixTree& tree = core_.index_.tree();
  const uint32_t tpb = core_.plan_.config().tokens_per_block;
  std::vector<std::pair<NodeId, CacheGroupId>> send;
  auto send_kv = [&](NodeId n) {
    for (const CacheGroup& g : core_.plan_.cache_groups()) {
      if (publishable(g) && g.kind == GroupKind::kAttention && core_.index_.holds(n, g.id))
        send.push_back({n, g.id});
    }
    core_.index_.mark_shared(n);
  };
  if (!has_recurrent_groups()) {
    for (NodeId n : blocks) {
      if (!core_.index_.shared(n)) send_kv(n);
    }
  } else if (snapshot != kNoNode && tree.node(snapshot).full &&
             tree.node(snapshot).tokens.size() == tpb) {
    for (const CacheGroup& g : core_.plan_.cache_groups()) {
      if (publishable(g) && g.kind == GroupKind::kSsm && core_.index_.holds(snapshot, g.id))
        send.push_back({snapshot, g.id});
    }
    for (NodeId n = snapshot;
         n != kNoNode && tree.node(n).parent != kNoNode && !core_.index_.shared(n);
         n = tree.node(n).parent) {
      send_kv(n);
    }
  }
  if (send.empty()) return;
  // Each object's payload is a copy of its page's slot, queued now behind the copies this commit
  // submitted (the snapshots); the publisher waits for it. Pages the CPU cannot reach (DISK) are
  // not sent; the none backend sends objects without payload (modelled). Beyond the queue's
  // room, objects are dropped (counted).
  const bool modelled = shared_->modelled();
  std::vector<SharedTier::Object> objects;
  for (const auto& [n, g] : send) {
    const PageId page = tree.pages(n)[g.value].page;
    if (!modelled && !readable(page)) continue;
    const SharedObjectKind kind = kind_of(core_.plan_.cache_group(g));
    std::optional<SharedTier::Object> o = shared_->object(
        shared_->key(kind, g, tree.node(n).key), shared_->header(kind, tree.node(n).tokens),
        core_.plan_.pool_group(core_.storage_.page(page).pool_group).slot_bytes);
    if (!o) continue;
    if (!modelled) core_.storage_.copy_out(page, o->buffer.get() + kSharedObjectHeaderBytes);
    objects.push_back(std::move(*o));
  }
  if (objects.empty()) return;
  shared_->publish(core_.storage_.flush(), std::move(objects));
}

}  // namespace hybridkv::cache_detail
