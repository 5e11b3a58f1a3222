// commit: a cache offers its computed blocks to the prefix index (deduplicated there), copies
// or moves its SSM states into snapshots, and plans snapshot drops.
#include <algorithm>
#include <cstring>

#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

using prefix::kNoNode;
using prefix::NodeId;
using storage::kGpuTier;
using storage::Ref;

Status ManagerCore::check_commit(uint32_t id, std::span<const int32_t> tokens) const {
  if (Status s = expect_state(id, CacheState::kActive, "commit"); !s) return s;
  const CacheRecord& rec = caches_[id];
  if (!rec.committing) {
    return Status(StatusCode::kFailedPrecondition, label(id) + ": commit after stop_committing");
  }
  const uint64_t c = rec.committed, e = c + tokens.size(), h = rec.history;
  auto range = [&] {  // built only for an error (every commit passes here)
    return "commit of tokens [" + std::to_string(c) + ", " + std::to_string(e) + ") with history " +
           std::to_string(h);
  };
  // DESIGN §5: a commit starts or ends at history; with commit_min_snapshot it ends there (a
  // snapshot is exact only at history). Starting at history commits tokens the current step
  // computes (they must fit in the capacity).
  // A commit that ends at a reserved state (reserve_states) ends where a snapshot is exact.
  const bool reserved = reserved_at(rec, e).has_value();
  if (plan_.config().commit_min_snapshot && e != h && !tokens.empty() && !reserved) {
    return Status::invalid(label(id) + ": " + range() +
                           ": with commit_min_snapshot a commit must end at history");
  }
  if (e != h && c != h && !tokens.empty() && !reserved) {
    return Status::invalid(label(id) + ": " + range() + ": a commit must start or end at history");
  }
  if (e > rec.capacity) {
    return Status::invalid(label(id) + ": " + range() + " ends past capacity " +
                           std::to_string(rec.capacity));
  }
  // The tokens the request already has must be the ones committed (memcmp first: a commit
  // covers up to a whole step's tokens, and an element loop was 2.5 % of the sim's CPU).
  const uint64_t known = std::min<uint64_t>(e, rec.tokens.size());
  if (known <= c || tokens.data() == rec.tokens.data() + c ||  // the cache's own tokens
      std::memcmp(rec.tokens.data() + c, tokens.data(), (known - c) * sizeof(int32_t)) == 0)
    return Status::ok();
  const auto [ours, theirs] =
      std::mismatch(rec.tokens.begin() + static_cast<int64_t>(c),
                    rec.tokens.begin() + static_cast<int64_t>(known), tokens.begin());
  const uint64_t i = static_cast<uint64_t>(ours - rec.tokens.begin());
  return Status::invalid(label(id) + ": commit token " + std::to_string(i) + " is " +
                         std::to_string(*theirs) + " but the request has " + std::to_string(*ours));
}

Status ManagerCore::commit(uint32_t id, std::span<const int32_t> tokens, bool is_end,
                           std::optional<SnapshotRole> role) {
  const bool with_snapshot = role.has_value();
  std::unique_lock lock(mu_);
  if (Status s = check_commit(id, tokens); !s) return s;
  CacheRecord& rec = caches_[id];
  const ManagerConfig& cfg = plan_.config();
  const uint32_t tpb = cfg.tokens_per_block;
  if (!cfg.enable_block_reuse || tokens.empty()) {
    if (is_end) (void)stop_committing_locked(id);
    after_mutation();
    return Status::ok();
  }
  const uint64_t c = rec.committed, e = c + tokens.size();
  // What gets published: full blocks completed by this commit; with commit_min_snapshot (or
  // at the end) the partial tail; an SSM snapshot where the commit ends at history.
  // A state the kernel wrote at e (reserve_states) is published as it is; at history the live
  // state serves.
  const std::optional<size_t> reserved = e < rec.history ? reserved_at(rec, e) : std::nullopt;
  bool tail = with_snapshot && e % tpb != 0 && (cfg.commit_min_snapshot || is_end);
  bool snapshot = with_snapshot && (e == rec.history || reserved) && (e % tpb == 0 || tail);
  std::vector<uint64_t> need = commit_pages(is_end, is_end || reserved, tail, snapshot);
  if (Status s = check_room("commit", need); !s)
    return Status(s.code(), label(id) + ": " + s.message());
  // A speculative snapshot is taken only where making room for it evicts nothing of value.
  if (role == SnapshotRole::kSpeculative && snapshot && !room_without_loss(need)) {
    tail = snapshot = false;
    need.assign(need.size(), 0);
  }
  if (rec.tokens.size() < e)
    rec.tokens.insert(rec.tokens.end(),
                      tokens.begin() + static_cast<int64_t>(rec.tokens.size() - c), tokens.end());
  make_room(need);
  if (rec.commit_parent == kNoNode) {
    rec.commit_parent = index_.root(rec.scope);
    index_.pin(rec.commit_parent);
    rec.hold_point = rec.commit_parent;
    take_path_hold(rec);
  }
  std::vector<NodeId> blocks;  // the full blocks committed (for the shared tier)
  for (uint64_t b = c / tpb; (b + 1) * tpb <= e; ++b) {
    prefetch_key(rec, b + kPrefetchBlocks);
    commit_full_block(rec, b);
    release_held(rec, b + 1);
    blocks.push_back(rec.commit_parent);
  }
  const NodeId end_node =
      tail ? commit_tail(rec, e, is_end) : (e % tpb == 0 ? rec.commit_parent : kNoNode);
  const bool snapshots = snapshot && end_node != kNoNode && index_.node_tokens(end_node) > 0;
  if (snapshots) commit_snapshots(rec, end_node, is_end, *role, reserved);
  release_reserved(rec, e);  // reservations the commit passed (or took) are done
  rec.committed = e;
  // The commit that covers the step ends the scratch slots' use.
  if (rec.scratch_boundary != 0 && e >= rec.scratch_boundary) release_scratch(rec);
  rec.note_ready(storage_.flush());
  shared_.publish(blocks, snapshots ? end_node : kNoNode);
  if (is_end) (void)stop_committing_locked(id);
  after_mutation();
  return Status::ok();
}

// Fresh GPU pages a commit needs, per pool group: the tail's and the snapshots' copies. A page
// that moves needs none (the tail at the end; the state at the end or a reserved one), except
// into a reduced-precision snapshot, always a converted copy.
std::vector<uint64_t> ManagerCore::commit_pages(bool tail_moves, bool state_moves, bool tail,
                                                bool snapshot) const {
  std::vector<uint64_t> need(plan_.pool_groups().size(), 0);
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (!publishable(g)) continue;
    const bool ssm = g.kind == GroupKind::kSsm;
    if (ssm ? state_moves && !g.snapshot_pool_group : tail_moves) continue;
    if (ssm ? snapshot : tail) need[g.page_pool_group(ssm).value] += 1;
  }
  return need;
}

// Whether the GPU has room for `need` without losing a page that is not demoted: the first
// eviction each needs frees a slot, goes back to a kept copy, or moves down into a free slot or
// a demoted page's. (Only the first eviction per pool group is judged: commits need one.)
bool ManagerCore::room_without_loss(std::span<const uint64_t> need) const {
  using Action = storage::Eviction::Action;
  for (uint32_t pg = 0; pg < need.size(); ++pg) {
    if (need[pg] == 0) continue;
    std::optional<storage::Eviction> e =
        storage_.next_eviction(kGpuTier, PoolGroupId(pg), need[pg]);
    while (e && e->counted && e->action == Action::kMoveDown)
      e = storage_.next_eviction(e->below, PoolGroupId(pg), 1);
    if (e && e->counted && e->action == Action::kDrop) return false;
  }
  return true;
}

// A full block: offered for every publishable attention group; where the tree already holds an
// equal page the cache adopts it and frees its own.
void ManagerCore::commit_full_block(CacheRecord& rec, uint64_t b) {
  const uint32_t tpb = plan_.config().tokens_per_block;
  const std::span<const int32_t> all(rec.tokens);
  const NodeId node = rec.prompt_keys && b < rec.prompt_keys->size()
                          ? index_.block_node_keyed(rec.commit_parent, (*rec.prompt_keys)[b],
                                                    all.subspan(b * tpb, tpb), /*full=*/true)
                          : index_.block_node(rec.commit_parent, all.subspan(b * tpb, tpb), b * tpb,
                                              rec.multimodal, /*full=*/true);
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (!publishable(g) || g.kind != GroupKind::kAttention || b >= rec.attention_blocks) continue;
    GroupState& gs = rec.groups[g.id.value];
    if (!gs.held.empty() && gs.held_begin == b) {  // a window block HELD for this commit
      const PageId held = gs.held.front();
      if (held != kNoPage) (void)index_.offer(node, g.id, held, tpb);
      continue;  // release_held frees the cache's reference after the loop
    }
    PageId* row = rec.row(g.id, b);
    const PageId own = row[0];
    if (own == kNoPage) continue;  // a window block freed without a commit
    const prefix::Offer offer = index_.offer(node, g.id, own, tpb);
    if (offer.result != prefix::OfferResult::kAdopt) continue;
    std::fill(row, row + rec.entries_of_beam0(b), offer.tree_page);
    storage_.add_ref(offer.tree_page, Ref::kActive);
    storage_.drop_ref(own, Ref::kActive);
    set_table_entries(rec, g, b, b + 1);
  }
  move_commit_parent(rec, node, holds_block(rec, node, b));
}

// Starts loading the key index's slot of block b's key (commit's lookups miss the cache: the
// index is as large as the tree).
void ManagerCore::prefetch_key(const CacheRecord& rec, uint64_t b) const {
  if (rec.prompt_keys && b < rec.prompt_keys->size()) index_.tree().prefetch((*rec.prompt_keys)[b]);
}

// Whether the cache's rows hold the tree's page of every attention group at block b's node
// (a page it kept instead, kKept, leaves the tree's own unheld).
bool ManagerCore::holds_block(const CacheRecord& rec, NodeId node, uint64_t b) const {
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (!publishable(g) || g.kind != GroupKind::kAttention) continue;
    if (b >= rec.attention_blocks ||
        *rec.row(g.id, b) != index_.tree().pages(node)[g.id.value].page)
      return false;
  }
  return true;
}

void ManagerCore::move_commit_parent(CacheRecord& rec, NodeId next, bool held) {
  index_.pin(next);
  const NodeId old = rec.commit_parent;
  rec.commit_parent = next;
  if (held && rec.hold_point == old) {  // the path to `next` is the cache's: the hold goes on
    rec.hold_point = next;
    if (rec.resumable_hold != kNoNode) {  // the new hold first: the path between stays counted
      index_.hold_resumable(next);
      index_.release_resumable(rec.resumable_hold);
      rec.resumable_hold = next;
    }
  }
  index_.unpin(old);
}

void ManagerCore::take_path_hold(CacheRecord& rec) {
  if (rec.resumable_hold != kNoNode || !rec.active() || rec.hold_point == kNoNode) return;
  if (index_.hold_resumable(rec.hold_point)) rec.resumable_hold = rec.hold_point;
}

void ManagerCore::drop_path_hold(CacheRecord& rec) {
  if (rec.resumable_hold == kNoNode) return;
  index_.release_resumable(rec.resumable_hold);
  rec.resumable_hold = kNoNode;
}

// The partial tail block: a leaf of its own, never rebased. Copied (moved with is_end).
NodeId ManagerCore::commit_tail(CacheRecord& rec, uint64_t end, bool is_end) {
  const uint32_t tpb = plan_.config().tokens_per_block;
  const uint64_t start = end / tpb * tpb;
  const uint64_t b = start / tpb;
  const std::span<const int32_t> all(rec.tokens);
  const NodeId node = index_.block_node(rec.commit_parent, all.subspan(start, end - start), start,
                                        rec.multimodal, /*full=*/false);
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (!publishable(g) || g.kind != GroupKind::kAttention) continue;
    if (b >= rec.attention_blocks || index_.holds(node, g.id)) continue;
    const PageId own = *rec.row(g.id, b);
    if (own == kNoPage) continue;
    PageId page = own;
    if (!is_end) {
      page = storage_.allocate(g.id, kGpuTier);
      storage_.copy_page(own, page);
    }
    index_.publish(node, g.id, page, static_cast<uint32_t>(end - start));
  }
  return node;
}

// SSM snapshots at the commit's end: copies of the live states, or the states themselves with
// is_end (the request computes nothing more) or from a reservation (the state a kernel wrote
// there; release_reserved frees one a copy was taken of).
void ManagerCore::commit_snapshots(CacheRecord& rec, NodeId node, bool is_end, SnapshotRole role,
                                   std::optional<size_t> reserved) {
  const bool speculative = role == SnapshotRole::kSpeculative;
  const uint32_t coverage = index_.node_tokens(node);
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (!publishable(g) || g.kind != GroupKind::kSsm) continue;
    GroupState& gs = rec.groups[g.id.value];
    const PageId own = reserved ? gs.reserved[*reserved] : gs.pages[0];
    if (own == kNoPage || index_.holds(node, g.id)) continue;
    // A reduced-precision snapshot is always a converted copy; the live state stays fp32.
    if (!(is_end || reserved) || g.snapshot_pool_group) {
      const PageId copy = storage_.allocate(g.id, kGpuTier, storage::kDefaultPriority, true);
      storage_.copy_page(own, copy);
      index_.publish(node, g.id, copy, coverage, speculative);
      continue;
    }
    index_.publish(node, g.id, own, coverage, speculative);
    if (reserved) {
      gs.reserved[*reserved] = kNoPage;
    } else {
      for (PageId& entry : gs.pages) {
        if (entry == own) entry = kNoPage;
      }
    }
    storage_.drop_ref(own, Ref::kActive);
  }
}

Status ManagerCore::stop_committing(uint32_t id) {
  std::unique_lock lock(mu_);
  const Status s = stop_committing_locked(id);
  after_mutation();
  return s;
}

Status ManagerCore::stop_committing_locked(uint32_t id) {
  CacheRecord& rec = caches_[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": stop_committing on a CLOSED cache");
  }
  rec.committing = false;
  release_held(rec, UINT64_MAX);  // no commit will publish them now
  drop_path_hold(rec);
  rec.hold_point = kNoNode;
  if (rec.commit_parent != kNoNode) {
    const NodeId old = rec.commit_parent;
    rec.commit_parent = kNoNode;
    index_.unpin(old);
  }
  return Status::ok();
}

Result<uint64_t> ManagerCore::plan_snapshot_drop(uint32_t id) {
  std::unique_lock lock(mu_);
  const CacheRecord& rec = caches_[id];
  if (rec.state == CacheState::kClosed) {
    return Status(StatusCode::kFailedPrecondition,
                  label(id) + ": plan_snapshot_drop on a CLOSED cache");
  }
  // The node ending at the last commit: the commit parent when aligned, else the tail leaf.
  const uint32_t tpb = plan_.config().tokens_per_block;
  const NodeId node = rec.committed % tpb == 0
                          ? rec.commit_parent
                          : index_.partial_child(rec.commit_parent, rec.committed);
  if (node == kNoNode || index_.node_tokens(node) == 0) {
    return Status(StatusCode::kNotFound, label(id) + ": no committed snapshot to plan a drop of");
  }
  const uint64_t drop = next_drop_++;
  drops_[drop] = index_.plan_drop(node);
  after_mutation();
  return drop;
}

Status ManagerCore::release_drop(uint64_t drop) {
  std::unique_lock lock(mu_);
  auto it = drops_.find(drop);
  if (it == drops_.end()) {
    return Status(StatusCode::kNotFound,
                  "planned drop " + std::to_string(drop) + " was already dropped");
  }
  for (const auto& [node, group] : it->second) index_.release_drop(node, group);
  drops_.erase(it);
  after_mutation();
  return Status::ok();
}

}  // namespace hybridkv::cache_detail
