// fetch_shared: a prompt's blocks from the shared tier into the local tree (DESIGN §8a).
//
// Three phases, the store's round trips outside the manager's lock:
//  1. (shared lock) the prompt's block keys and what the local tree holds of each;
//  2. (no lock) one pipelined EXISTS for everything the tree lacks; the hit is the longest
//     prefix whose full-attention KV chain is complete, whose window blocks are there, and that
//     ends at a snapshot of every recurrent group (KV without its state is a miss); one GET for
//     what the hit needs, each object checked (checksum, fingerprint, kind, the block's tokens).
//     An object that fails its checks is deleted and counted, one missing between EXISTS and GET
//     (evicted meanwhile) is a miss; either way the hit is computed again without it;
//  3. (exclusive lock) the pages on the HOST tier (the GPU without one), room made there with
//     the chain's own pages pinned, the bytes written (none with the none backend: objects
//     without payload, modelled), the pages published at their nodes: the next match finds
//     them like any other.
#include <cstring>
#include <map>
#include <set>

#include "cache/manager_core.h"
#include "cache/shared_tier.h"
#include "prefix/block_hash.h"
#include "storage/room.h"

namespace hybridkv::cache_detail {

using prefix::kNoNode;
using prefix::NodeId;

// Requires: have(b, g) answers whether block b of group g is local or in the store.
template <typename Have>
uint64_t SharedLink::shared_hit_blocks(uint64_t blocks, Have&& have) const {
  const uint32_t tpb = core_.plan_.config().tokens_per_block;
  const bool hybrid = has_recurrent_groups();
  uint64_t best = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    bool chain = true, ends = true;
    for (const CacheGroup& g : core_.plan_.cache_groups()) {
      if (g.policy != ReusePolicy::kRequired) continue;
      if (g.kind == GroupKind::kAttention && !g.window) chain = chain && have(b, g.id);
      if (g.kind == GroupKind::kSsm) ends = ends && have(b, g.id);
      if (g.kind == GroupKind::kAttention && g.window) {
        const uint64_t end = (b + 1) * tpb;
        const uint64_t first = end > *g.window ? (end - *g.window) / tpb : 0;
        for (uint64_t w = first; w <= b; ++w) ends = ends && have(w, g.id);
        for (uint64_t s = 0; s < std::min<uint64_t>(g.sink_blocks, first); ++s)
          ends = ends && have(s, g.id);
      }
    }
    if (!chain) break;
    if (!hybrid || ends) best = b + 1;
  }
  return best;
}

Result<SharedFetch> SharedLink::fetch(const ReuseScope& scope, std::span<const int32_t> tokens) {
  if (!shared_) {
    return Status(StatusCode::kFailedPrecondition,
                  "fetch_shared: no shared tier (ManagerConfig::shared.store is not set)");
  }
  const uint32_t tpb = core_.plan_.config().tokens_per_block;
  const uint64_t blocks = std::min<uint64_t>(tokens.empty() ? 0 : (tokens.size() - 1) / tpb,
                                             shared_->max_lookup_blocks());
  std::vector<BlockKey> keys;
  std::set<SharedBlock> local;
  local_blocks(scope, tokens.first(blocks * tpb), keys, local);  // 1. (shared lock)
  SharedFetch out;
  out.local_tokens = shared_hit_blocks(blocks,
                                       [&](uint64_t b, CacheGroupId g) {
                                         return local.count({b, g}) > 0;
                                       }) *
                     tpb;
  // 2. what the store holds, then the objects the hit needs
  std::set<SharedBlock> present = in_store(keys, local, out);  // 2. (no lock)
  std::map<SharedBlock, std::vector<std::byte>> fetched;
  uint64_t hit = 0;
  for (int round = 0; round < 4; ++round) {
    hit = shared_hit_blocks(blocks, [&](uint64_t b, CacheGroupId g) {
      return local.count({b, g}) > 0 || present.count({b, g}) > 0;
    });
    if (hit * tpb <= out.local_tokens) break;
    std::vector<SharedBlock> need;
    uint64_t bytes = 0;
    for (const SharedBlock& w : present) {
      if (w.block < hit && fetched.count(w) == 0 &&
          (core_.plan_.cache_group(w.group).kind != GroupKind::kSsm || w.block + 1 == hit)) {
        need.push_back(w);
        bytes += core_.plan_.pool_group(core_.plan_.cache_group(w.group).page_pool_group(true))
                     .slot_bytes;
      }
    }
    if (need.empty()) break;
    if (round == 0 && shared_->slower_than_recomputing(bytes, hit * tpb - out.local_tokens)) {
      out.skipped = true;
      break;
    }
    get_shared(need, keys, tokens, present, fetched, out);
  }
  if (hit * tpb <= out.local_tokens || fetched.empty()) {
    out.hit_tokens = out.local_tokens;
    shared_->count_fetch(out);
    return out;
  }
  // 3. into the local tree
  std::unique_lock lock(core_.mu_);
  if (Status s = adopt_shared(scope, tokens, keys, hit, fetched, out); !s) return s;
  out.hit_tokens = hit * tpb;
  shared_->count_fetch(out);
  core_.after_mutation();
  return out;
}

// The block keys of `tokens` (whole blocks) and the (block, group) pages the local tree holds.
void SharedLink::local_blocks(const ReuseScope& scope, std::span<const int32_t> tokens,
                              std::vector<BlockKey>& keys, std::set<SharedBlock>& local) const {
  const uint32_t tpb = core_.plan_.config().tokens_per_block;
  std::shared_lock lock(core_.mu_);
  prefix::BlockHasher hasher(core_.plan_.config().block_hash);
  BlockKey chain = hasher.root(scope);
  for (uint64_t b = 0; b < tokens.size() / tpb; ++b) {
    chain = hasher.key(chain, tokens.subspan(b * tpb, tpb));
    keys.push_back(chain);
    const NodeId node = core_.index_.find(chain);
    for (const CacheGroup& g : core_.plan_.cache_groups()) {
      if (node != kNoNode && core_.index_.holds(node, g.id)) local.insert({b, g.id});
    }
  }
}

// One pipelined EXISTS for every publishable (block, group) the tree lacks: those present.
std::set<SharedBlock> SharedLink::in_store(const std::vector<BlockKey>& keys,
                                           const std::set<SharedBlock>& local,
                                           SharedFetch& out) const {
  std::vector<SharedBlock> asked;
  std::vector<std::string> ask_keys;
  for (uint64_t b = 0; b < keys.size(); ++b) {
    for (const CacheGroup& g : core_.plan_.cache_groups()) {
      if (!publishable(g) || local.count({b, g.id}) > 0) continue;
      asked.push_back({b, g.id});
      ask_keys.push_back(shared_->key(kind_of(g), g.id, keys[b]));
    }
  }
  std::set<SharedBlock> present;
  const std::vector<StoreOutcome> found = shared_->store().exists(ask_keys);
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i] == StoreOutcome::kOk) present.insert(asked[i]);
    out.store_failures += found[i] == StoreOutcome::kFailed ? 1 : 0;
  }
  return present;
}

std::future<Result<SharedFetch>> SharedLink::fetch_async(const ReuseScope& scope,
                                                         std::vector<int32_t> tokens) {
  if (!shared_) {
    std::promise<Result<SharedFetch>> none;
    none.set_value(Status(StatusCode::kFailedPrecondition,
                          "fetch_shared_async: no shared tier (ManagerConfig::shared.store is "
                          "not set)"));
    return none.get_future();
  }
  // The tier stops (answering what has not run) before anything the fetch uses goes.
  return shared_->run_fetch(
      [this, scope, tokens = std::move(tokens)] { return fetch(scope, tokens); });
}

SharedTierStats SharedLink::stats() const { return shared_ ? shared_->stats() : SharedTierStats{}; }

void SharedLink::flush() {
  if (shared_) shared_->drain();
}

uint64_t SharedLink::payload_bytes(const CacheGroup& g) const {
  return shared_->payload_bytes(core_.plan_.pool_group(g.page_pool_group(true)).slot_bytes);
}

SharedObjectKind SharedLink::kind_of(const CacheGroup& g) {
  return g.kind == GroupKind::kSsm ? SharedObjectKind::kSnapshot : SharedObjectKind::kKvBlock;
}

// One pipelined GET of `need`; objects that pass their checks go to `fetched`, the others leave
// `present` (a corrupt one is deleted from the store).
void SharedLink::get_shared(const std::vector<SharedBlock>& need, const std::vector<BlockKey>& keys,
                            std::span<const int32_t> tokens, std::set<SharedBlock>& present,
                            std::map<SharedBlock, std::vector<std::byte>>& fetched,
                            SharedFetch& out) const {
  const uint32_t tpb = core_.plan_.config().tokens_per_block;
  std::vector<std::string> get_keys;
  std::vector<std::vector<std::byte>> buffers;
  for (const SharedBlock& w : need) {
    const CacheGroup& g = core_.plan_.cache_group(w.group);
    get_keys.push_back(shared_->key(kind_of(g), w.group, keys[w.block]));
    buffers.emplace_back(payload_bytes(g) + kSharedObjectHeaderBytes + kSharedObjectTrailerBytes);
  }
  std::vector<std::span<std::byte>> spans(buffers.begin(), buffers.end());
  std::vector<uint64_t> sizes(need.size(), 0);
  const std::vector<StoreOutcome> got = shared_->store().get(get_keys, spans, sizes);
  std::vector<std::string> corrupt;
  for (size_t i = 0; i < need.size(); ++i) {
    const SharedBlock& w = need[i];
    const CacheGroup& g = core_.plan_.cache_group(w.group);
    if (got[i] == StoreOutcome::kOk) {
      const auto object = std::span<const std::byte>(buffers[i]).first(sizes[i]);
      const Result<std::span<const std::byte>> payload = open_shared_object(
          object, shared_->header(kind_of(g), tokens.subspan(w.block * tpb, tpb)));
      if (payload && payload->size() == payload_bytes(g)) {
        fetched[w].assign(payload->begin(), payload->end());
        ++out.objects_fetched;
        out.bytes_fetched += core_.plan_.pool_group(g.page_pool_group(true)).slot_bytes;
        continue;
      }
    }
    present.erase(w);
    if (got[i] == StoreOutcome::kOk || got[i] == StoreOutcome::kTooLarge) {
      ++out.objects_corrupt;
      corrupt.push_back(get_keys[i]);
    } else {
      out.store_failures += got[i] == StoreOutcome::kFailed ? 1 : 0;
    }
  }
  if (!corrupt.empty()) (void)shared_->store().remove(corrupt);
}

}  // namespace hybridkv::cache_detail

namespace hybridkv::cache_detail {

// Requires core_.mu_ (exclusive). Pages for the fetched objects the tree still lacks, published at
// their nodes; when the room is not there, nothing changes and the hit is what was local.
Status SharedLink::adopt_shared(const ReuseScope& scope, std::span<const int32_t> tokens,
                                const std::vector<BlockKey>& keys, uint64_t hit,
                                std::map<SharedBlock, std::vector<std::byte>>& fetched,
                                SharedFetch& out) {
  storage::TierIndex tier = storage::kGpuTier;
  for (uint32_t t = 1; t < core_.storage_.num_tiers(); ++t) {
    if (core_.storage_.tier_kind(storage::TierIndex(t)) == TierKind::kHost) {
      tier = storage::TierIndex(t);
      break;
    }
  }
  std::vector<uint64_t> need(core_.plan_.pool_groups().size(), 0);
  std::vector<const SharedBlock*> todo;
  for (const auto& [w, bytes] : fetched) {
    const NodeId node = core_.index_.find(keys[w.block]);
    if (node != kNoNode && core_.index_.holds(node, w.group)) continue;  // arrived meanwhile
    ++need[core_.plan_.cache_group(w.group).page_pool_group(true).value];
    todo.push_back(&w);
  }
  // The chain's own pages are no room for it.
  std::vector<PageId> pinned;
  for (uint64_t b = 0; b < hit; ++b) {
    const NodeId node = core_.index_.find(keys[b]);
    if (node == kNoNode) continue;
    for (const prefix::NodePage& np : core_.index_.tree().pages(node)) {
      if (np.page != kNoPage && !core_.storage_.page(np.page).pinned) {
        core_.storage_.pin(np.page);
        pinned.push_back(np.page);
      }
    }
  }
  bool room = true;
  for (const PoolGroup& pg : core_.plan_.pool_groups())
    room = room && core_.storage_.max_room(tier, pg.id) >= need[pg.id.value];
  if (room) {
    for (const PoolGroup& pg : core_.plan_.pool_groups()) {
      if (need[pg.id.value] > 0)
        storage::make_room(core_.storage_, tier, pg.id, need[pg.id.value], core_.index_);
    }
    place_shared(scope, tokens, hit, tier, todo, fetched);
  }
  for (PageId p : pinned) core_.storage_.unpin(p);
  core_.deliver_notices();
  if (!room) {
    out.objects_fetched = out.bytes_fetched = 0;
    return Status(StatusCode::kOutOfPages,
                  "fetch_shared: no room on the " +
                      std::string(tier_kind_name(core_.storage_.tier_kind(tier))) + " tier for " +
                      std::to_string(todo.size()) + " fetched pages");
  }
  return Status::ok();
}

// Requires: room for `todo` on `tier`. Creates the chain's nodes, gives each fetched object a
// page there, writes the bytes once the slots are free of earlier copies, and publishes them.
void SharedLink::place_shared(const ReuseScope& scope, std::span<const int32_t> tokens,
                              uint64_t hit, storage::TierIndex tier,
                              const std::vector<const SharedBlock*>& todo,
                              std::map<SharedBlock, std::vector<std::byte>>& fetched) {
  const uint32_t tpb = core_.plan_.config().tokens_per_block;
  std::vector<std::pair<NodeId, const SharedBlock*>> placed;
  NodeId parent = core_.index_.root(scope);
  size_t next = 0;
  for (uint64_t b = 0; b < hit; ++b) {
    const NodeId node =
        core_.index_.block_node(parent, tokens.subspan(b * tpb, tpb), b * tpb, {}, true);
    for (; next < todo.size() && todo[next]->block == b; ++next)
      placed.push_back({node, todo[next]});
    parent = node;
  }
  std::vector<PageId> pages;
  for (const auto& [node, w] : placed) {
    const bool ssm = core_.plan_.cache_group(w->group).kind == GroupKind::kSsm;
    pages.push_back(core_.storage_.allocate(w->group, tier, storage::kDefaultPriority, ssm));
  }
  (void)core_.storage_.flush();  // copies of the room just made that read these slots
  CopyEvent latest;
  for (PageId p : pages) {
    if (core_.storage_.page(p).ready.ticket > latest.ticket) latest = core_.storage_.page(p).ready;
  }
  core_.backend_->wait(latest);
  std::vector<PoolTransfer> all;  // straight from the fetched bytes into the slots
  for (size_t i = 0; i < placed.size(); ++i) {
    const std::vector<PoolTransfer> t = slot_transfers(pages[i], fetched[*placed[i].second].data());
    all.insert(all.end(), t.begin(), t.end());
  }
  core_.backend_->write_many(all);
  for (size_t i = 0; i < placed.size(); ++i) {
    const auto [node, w] = placed[i];
    core_.index_.publish(node, w->group, pages[i], tpb);
    if (core_.plan_.cache_group(w->group).kind == GroupKind::kAttention)
      core_.index_.mark_shared(node);
  }
}

}  // namespace hybridkv::cache_detail
