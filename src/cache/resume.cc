// resume and suspend, and what a prefix match gives a new cache: its shared pages at create,
// its choice of OPTIONAL groups and private copies of shared tails at the first resume.
#include <algorithm>

#include "cache/manager_core.h"
#include "plan/plan_internal.h"
#include "util/blocks.h"
#include "util/check.h"

namespace hybridkv::cache_detail {

using storage::kGpuTier;
using storage::Ref;

// What a resume needs per GPU pool group.
struct ManagerCore::ResumeNeeds {
  std::vector<uint64_t> pages;   // GPU slots to make free: fresh pages, pages to onboard
  std::vector<uint64_t> locked;  // GPU slots that newly stay locked after the resume
  storage::Exclusions excluded;  // own queued pages, per tier: no room for the resume
  bool over_gate = false;        // the walk stopped: `locked` passed the gate's headroom
};

ManagerCore::ResumeNeeds ManagerCore::resume_needs(const CacheRecord& rec, bool first,
                                                   const std::vector<uint64_t>& fresh,
                                                   const std::vector<uint64_t>& headroom) const {
  ResumeNeeds n{fresh, fresh, storage_.empty_exclusions()};
  n.over_gate = !for_each_page_while(rec, [&](PageId pid, const CacheGroup& g, uint64_t block) {
    const storage::Page& p = storage_.page(pid);
    const GroupState& gs = rec.groups[g.id.value];
    const bool dropped_now = first && !gs.selected;  // replaced by a fresh page
    // A tree page the first resume copies from is released right after the copy: it needs the
    // GPU for a moment, but the gate counts what stays locked.
    const bool copy_source = first && gs.selected && gs.copy_pending &&
                             (g.kind == GroupKind::kSsm || block + 1 == rec.attention_blocks);
    const uint32_t pg = p.pool_group.value;
    if (dropped_now || p.tier != TierKind::kGpu) ++n.pages[pg];
    storage_.exclude(n.excluded, p);
    // A replacement page stays locked, and so does an own page the resume locks, unless it is
    // only the source of a private copy (onboarded if it must be, then let go).
    if (dropped_now) ++n.locked[pg];
    const bool evictable_or_away = p.queue != storage::QueueKind::kNone || p.tier != TierKind::kGpu;
    if (!dropped_now && !copy_source && evictable_or_away) ++n.locked[pg];
    return n.locked[pg] <= headroom[pg];
  });
  if (!first || n.over_gate) return n;
  // Private copies of the matched tail block and snapshots.
  for (const CacheGroup& g : plan_.cache_groups()) {
    const GroupState& gs = rec.groups[g.id.value];
    if (!gs.copy_pending || !gs.selected) continue;
    const bool attention = g.kind == GroupKind::kAttention;
    const bool shared_tail =
        attention && rec.attention_blocks > 0 && rec.beams_at(rec.attention_blocks - 1) == 1;
    n.pages[g.pool_group.value] += shared_tail ? 1 : rec.beam_width;
    n.locked[g.pool_group.value] += shared_tail ? 1 : rec.beam_width;
  }
  return n;
}

namespace {

// A GPU pool group as the utilization gate sees it: slots locked now, and how many may be.
struct GateSlots {
  uint64_t total = 0;
  uint64_t locked = 0;
  uint64_t usable = 0;
};

GateSlots gate_slots(const storage::Storage& storage, PoolGroupId pg, double util) {
  const storage::Storage::SlotCounts n = storage.counts(kGpuTier, pg);
  return {n.total, n.total - n.free - n.evictable, plan_detail::usable_slots(n.total, util)};
}

}  // namespace

std::vector<uint64_t> ManagerCore::utilization_headroom() const {
  std::vector<uint64_t> headroom(plan_.pool_groups().size(), 0);
  for (const PoolGroup& pg : plan_.pool_groups()) {
    const GateSlots g = gate_slots(storage_, pg.id, plan_.config().max_util_for_resume);
    headroom[pg.id.value] = g.usable > g.locked ? g.usable - g.locked : 0;
  }
  return headroom;
}

// The utilization gate: what would be locked after the resume, per GPU pool group (`locked`:
// slots the resume newly locks; `fresh_only`: only its fresh pages, a lower bound; `partial`:
// the pages counted before the walk stopped, also a lower bound).
Status ManagerCore::utilization_gate(uint32_t id, const std::vector<uint64_t>& locked_by_resume,
                                     bool fresh_only, bool partial) const {
  const double util = plan_.config().max_util_for_resume;
  for (const PoolGroup& pg : plan_.pool_groups()) {
    const GateSlots g = gate_slots(storage_, pg.id, util);
    const uint64_t after = g.locked + locked_by_resume[pg.id.value];
    if (after > g.usable) {
      return Status(StatusCode::kRefused,
                    label(id) + ": resume refused: pool group " + std::to_string(pg.id.value) +
                        " (GPU) would have " + (partial ? "at least " : "") +
                        std::to_string(after) + " of " + std::to_string(g.total) +
                        " slots locked, above max_util_for_resume " + std::to_string(util) + " (" +
                        std::to_string(g.usable) + " slots)" +
                        (fresh_only ? ", counting only its fresh pages" : ""));
    }
  }
  return Status::ok();
}

Status ManagerCore::resume(uint32_t id, const std::vector<CacheGroupId>& optional_groups) {
  std::unique_lock lock(mu_);
  const Status s = resume_locked(id, optional_groups);
  if (s.code() == StatusCode::kRefused || s.code() == StatusCode::kOutOfPages)
    ++storage_.stats().refused_resumes;
  after_mutation();
  return s;
}

Status ManagerCore::resume_allowed(uint32_t id, const CacheRecord& rec, bool first,
                                   ResumeNeeds& needs) const {
  // A request waiting for room is asked about every step: a gate its fresh pages alone fail
  // refuses it without reading its pages, and the walk over its pages stops where the gate
  // fails (on the conversation trace a refused walk read 1,077 pages, half of them past that).
  const std::vector<uint64_t> fresh = new_pages_needed(rec, rec.capacity, rec.history, 0);
  if (Status s = utilization_gate(id, fresh, true); !s) return s;
  needs = resume_needs(rec, first, fresh, utilization_headroom());
  if (Status s = utilization_gate(id, needs.locked, false, needs.over_gate); !s) return s;
  HKV_CHECK(!needs.over_gate, "the walk stopped short of a gate that passes");
  if (Status s = check_room("resume", needs.pages, &needs.excluded); !s)
    return Status(s.code(), label(id) + ": " + s.message());
  return Status::ok();
}

Status ManagerCore::can_resume(uint32_t id,
                               const std::vector<CacheGroupId>& optional_groups) const {
  std::shared_lock lock(mu_);
  if (Status s = expect_state(id, CacheState::kSuspended, "resume"); !s) return s;
  const CacheRecord& rec = caches_[id];
  ResumeNeeds needs;
  if (rec.first_resume_done) return resume_allowed(id, rec, false, needs);
  std::vector<bool> selected;
  if (Status s = optional_selection(id, optional_groups, rec, selected); !s) return s;
  if (selection_unchanged(rec, selected)) return resume_allowed(id, rec, true, needs);
  // Another OPTIONAL choice is tried on a copy (the record holds the whole prompt: a copy
  // for every check was 3 % of the sim's CPU).
  CacheRecord chosen = rec;
  apply_selection(chosen, selected);
  return resume_allowed(id, chosen, true, needs);
}

Result<uint64_t> ManagerCore::pages_away(uint32_t id) const {
  std::shared_lock lock(mu_);
  if (Status s = expect_state(id, CacheState::kSuspended, "pages_away"); !s) return s;
  uint64_t away = 0;
  for_each_page(caches_[id], [&](PageId pid, const CacheGroup&, uint64_t) {
    away += storage_.page(pid).tier != TierKind::kGpu;
  });
  return away;
}

Result<uint64_t> ManagerCore::prefetch(uint32_t id, uint64_t max_pages) {
  std::unique_lock lock(mu_);
  if (Status s = expect_state(id, CacheState::kSuspended, "prefetch"); !s) return s;
  CacheRecord& rec = caches_[id];
  std::vector<uint64_t> need(plan_.pool_groups().size(), 0);
  storage::Exclusions excluded = storage_.empty_exclusions();
  std::vector<PageId> own, away;
  for_each_page(rec, [&](PageId pid, const CacheGroup&, uint64_t) {
    own.push_back(pid);
    storage_.exclude(excluded, pid);  // room is never made by demoting the cache's own pages
    const storage::Page& p = storage_.page(pid);
    if (p.tier == TierKind::kGpu || away.size() == max_pages) return;
    ++need[p.pool_group.value];
    away.push_back(pid);
  });
  if (away.empty()) return uint64_t{0};
  if (Status s = check_room("prefetch", need, &excluded); !s)
    return Status(s.code(), label(id) + ": " + s.message());
  for (PageId pid : own) storage_.pin(pid);
  make_room(need);
  for (PageId pid : away) storage_.move(pid, kGpuTier);
  deliver_notices();
  for (PageId pid : own) storage_.unpin(pid);
  rec.note_ready(storage_.flush());
  after_mutation();
  return away.size();
}

Status ManagerCore::resume_locked(uint32_t id, const std::vector<CacheGroupId>& optional_groups) {
  if (Status s = expect_state(id, CacheState::kSuspended, "resume"); !s) return s;
  CacheRecord& rec = caches_[id];
  const bool first = !rec.first_resume_done;
  // The OPTIONAL choice is made (and checked) once; it persists across suspend/resume.
  if (first) {
    if (Status s = choose_optional_groups(id, optional_groups, rec); !s) return s;
  }
  ResumeNeeds needs;
  if (Status s = resume_allowed(id, rec, first, needs); !s) return s;

  // Nothing can fail from here on.
  std::vector<std::pair<PageId, bool>> own;  // page, and whether it comes to the GPU
  for_each_page(rec, [&](PageId pid, const CacheGroup& g, uint64_t) {
    storage_.pin(pid);
    own.push_back({pid, !(first && !rec.groups[g.id.value].selected)});
  });
  make_room(needs.pages);
  for (auto [pid, onboard] : own) {
    if (onboard && storage_.page(pid).tier != TierKind::kGpu) storage_.move(pid, kGpuTier);
  }
  deliver_notices();
  for (auto [pid, onboard] : own) {
    // An unselected OPTIONAL page stays HELD until finish_first_resume lets it go.
    if (onboard) storage_.convert_ref(pid, Ref::kSuspended, Ref::kActive);
  }
  for (auto [pid, onboard] : own) storage_.unpin(pid);
  if (first) finish_first_resume(rec);
  allocate_pages(rec, rec.capacity, rec.history, 0);
  rec.note_ready(storage_.flush());
  for_each_page(rec, [&](PageId pid, const CacheGroup&, uint64_t) {
    rec.note_ready(storage_.page(pid).ready);
  });
  rec.state = CacheState::kActive;
  take_path_hold(rec);
  ++active_caches_;
  ++storage_.stats().resumes;
  rebuild_tables(rec);
  return Status::ok();
}

Status ManagerCore::suspend(uint32_t id) {
  std::unique_lock lock(mu_);
  if (Status s = expect_state(id, CacheState::kActive, "suspend"); !s) return s;
  CacheRecord& rec = caches_[id];
  release_scratch(rec);  // scratch KV is dead once the step is over
  release_reserved(rec, UINT64_MAX);
  drop_path_hold(rec);  // before its pages are queued HELD
  for_each_page(rec, [&](PageId pid, const CacheGroup&, uint64_t) {
    storage_.convert_ref(pid, Ref::kActive, Ref::kSuspended);
  });
  rec.state = CacheState::kSuspended;
  --active_caches_;
  ++storage_.stats().suspends;
  rebuild_tables(rec);
  after_mutation();
  return Status::ok();
}

// The match's pages (planned by the index: MatchPlan::pages) become the cache's: per group,
// one storage call for the references and one index call for the served counts.
void ManagerCore::attach_match(CacheRecord& rec, const prefix::MatchPlan& mp) {
  const uint32_t tpb = plan_.config().tokens_per_block;
  const uint64_t L = mp.match.reused_tokens;
  rec.match = mp.match;
  rec.capacity = rec.history = rec.committed = L;
  const uint64_t blocks = blocks_for(L, tpb);
  rec.attention_blocks = blocks;
  std::vector<PageId> taken;  // one entry per reference the cache takes
  for (const CacheGroup& g : plan_.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (g.kind == GroupKind::kAttention) {
      gs.pages.assign(blocks * rec.beam_width, kNoPage);
      for (uint32_t k = 0; k < rec.beam_width; ++k) gs.tables[k].assign(blocks, kBadPageIndex);
      gs.stale_from = g.first_live_block(L, tpb);
    }
    if (L == 0 || g.policy == ReusePolicy::kPrivate) continue;
    const std::vector<PageId>& reused = mp.pages[g.id.value];
    taken.clear();
    if (g.kind == GroupKind::kSsm) {
      if (reused.front() == kNoPage) continue;
      gs.pages.assign(gs.pages.size(), reused.front());
      taken.assign(gs.pages.size(), reused.front());
      gs.copy_pending = true;
    } else {
      for (uint64_t b = 0; b < blocks; ++b) {
        if (!block_needed(g, b, L, L) || reused[b] == kNoPage) continue;  // kNoPage: OPTIONAL
        std::fill(rec.row(g.id, b), rec.row(g.id, b) + rec.beam_width, reused[b]);
        taken.insert(taken.end(), rec.beams_at(b), reused[b]);
      }
      gs.copy_pending = L % tpb != 0;
    }
    storage_.add_refs(taken, Ref::kSuspended);
    index_.record_served(taken);
    if (!taken.empty()) storage_.stats().groups[g.id.value].reused_blocks += taken.size();
  }
  // The next commit hangs under the last full block of the match.
  rec.commit_parent = L >= tpb ? mp.path[L / tpb - 1] : mp.root;
  if (rec.commit_parent != prefix::kNoNode) index_.pin(rec.commit_parent);
  rec.hold_point = rec.commit_parent;  // the match's pages are the cache's
  record_lookup(rec, false);
}

void ManagerCore::record_lookup(const CacheRecord& rec, bool optional_only) {
  std::vector<CacheGroupId> groups;
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.policy == ReusePolicy::kPrivate) continue;
    if ((g.policy == ReusePolicy::kOptional) != optional_only) continue;
    if (g.policy == ReusePolicy::kOptional && !rec.groups[g.id.value].selected) continue;
    groups.push_back(g.id);
  }
  index_.record_lookup(rec.match, groups);
}

Status ManagerCore::choose_optional_groups(uint32_t id, const std::vector<CacheGroupId>& chosen,
                                           CacheRecord& rec) const {
  std::vector<bool> selected;
  if (Status s = optional_selection(id, chosen, rec, selected); !s) return s;
  apply_selection(rec, selected);
  return Status::ok();
}

// Which groups `chosen` selects (by cache group id), checked: OPTIONAL groups matched whole.
Status ManagerCore::optional_selection(uint32_t id, const std::vector<CacheGroupId>& chosen,
                                       const CacheRecord& rec, std::vector<bool>& selected) const {
  selected.assign(plan_.cache_groups().size(), false);
  for (CacheGroupId g : chosen) {
    if (g.value >= plan_.cache_groups().size()) {
      return Status::invalid(label(id) + ": resume: unknown cache group " +
                             std::to_string(g.value));
    }
    const CacheGroup& group = plan_.cache_group(g);
    if (group.policy != ReusePolicy::kOptional) {
      return Status::invalid(label(id) + ": resume: cache group " + std::to_string(g.value) +
                             " is " + reuse_policy_name(group.policy) +
                             ", only OPTIONAL groups can be selected");
    }
    if (!rec.match.groups[g.value].complete) {
      return Status::invalid(label(id) + ": resume: OPTIONAL cache group " +
                             std::to_string(g.value) + " matched up to " +
                             std::to_string(rec.match.groups[g.value].endpoint) +
                             " tokens, not the reused " + std::to_string(rec.match.reused_tokens));
    }
    selected[g.value] = true;
  }
  return Status::ok();
}

void ManagerCore::apply_selection(CacheRecord& rec, const std::vector<bool>& selected) const {
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.policy == ReusePolicy::kOptional) rec.groups[g.id.value].selected = selected[g.id.value];
  }
}

bool ManagerCore::selection_unchanged(const CacheRecord& rec,
                                      const std::vector<bool>& selected) const {
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (g.policy == ReusePolicy::kOptional &&
        rec.groups[g.id.value].selected != selected[g.id.value])
      return false;
  }
  return true;
}

// An unselected OPTIONAL group gives back what it matched: the engine recomputes that state.
void ManagerCore::give_back_unselected(CacheRecord& rec, const CacheGroup& g) {
  GroupState& gs = rec.groups[g.id.value];
  const Ref ref = Ref::kSuspended;  // these pages were never brought to the GPU
  if (g.kind == GroupKind::kSsm) {
    for (PageId& e : gs.pages) {
      if (e != kNoPage) storage_.drop_ref(e, ref);
      e = kNoPage;
    }
  } else {
    for (uint64_t b = 0; b < rec.attention_blocks; ++b) {
      PageId* row = rec.row(g.id, b);
      for (uint32_t k = 0; k < rec.beams_at(b); ++k) {
        if (row[k] != kNoPage) storage_.drop_ref(row[k], ref);
      }
      std::fill(row, row + rec.beam_width, kNoPage);
    }
  }
  gs.copy_pending = false;
}

// A private GPU copy of a shared page; the cache's reference moves to the copy.
PageId ManagerCore::private_copy(const CacheGroup& g, PageId src) {
  const PageId dst = storage_.allocate(g.id, kGpuTier);
  storage_.add_ref(dst, Ref::kActive);
  storage_.copy_page(src, dst);
  storage_.drop_ref(src, Ref::kActive);
  return dst;
}

void ManagerCore::finish_first_resume(CacheRecord& rec) {
  for (const CacheGroup& g : plan_.cache_groups()) {
    if (!rec.groups[g.id.value].selected) give_back_unselected(rec, g);
  }
  // The partially matched tail block and the SSM snapshots are copied into private pages:
  // shared pages are never written.
  for (const CacheGroup& g : plan_.cache_groups()) {
    GroupState& gs = rec.groups[g.id.value];
    if (!gs.copy_pending) continue;
    gs.copy_pending = false;
    if (g.kind == GroupKind::kSsm) {
      for (PageId& e : gs.pages) {
        if (e != kNoPage) e = private_copy(g, e);
      }
      continue;
    }
    const uint64_t b = rec.attention_blocks - 1;
    PageId* row = rec.row(g.id, b);
    if (row[0] == kNoPage) continue;
    if (rec.beams_at(b) == 1) {
      std::fill(row, row + rec.beam_width, private_copy(g, row[0]));
    } else {
      for (uint32_t k = 0; k < rec.beam_width; ++k) row[k] = private_copy(g, row[k]);
    }
  }
  rec.first_resume_done = true;
  record_lookup(rec, true);
}

}  // namespace hybridkv::cache_detail
