// The invariant checker of the whole manager (DESIGN §9) and the metadata snapshot.
#include <sstream>
#include <vector>

#include "cache/manager_core.h"

namespace hybridkv::cache_detail {

using prefix::kNoNode;
using prefix::NodeId;

std::string ManagerReads::check() const {
  std::shared_lock lock(core_.mu_);
  return core_.check_locked();
}

// Storage's and the index's own invariants, then: every page's counts equal the caches that
// refer to it, active caches sit on the GPU, and block tables agree with the pages.
std::string ManagerCore::check_locked() const {
  std::string err = storage_.check();
  if (err.empty() && storage_.has_notices()) err = "storage holds notices the index never got";
  if (err.empty()) err = index_.check();
  if (!err.empty()) return err;
  // By page: (active, suspended) references the caches hold.
  std::vector<std::pair<uint32_t, uint32_t>> refs(storage_.page_capacity(), {0, 0});
  uint64_t live = 0, active = 0;
  for (uint32_t id = 0; id < caches_.size(); ++id) {
    const CacheRecord& rec = caches_[id];
    if (!rec.in_use || rec.state == CacheState::kClosed) continue;
    ++live;
    active += rec.active() ? 1 : 0;
    for_each_page(rec, [&](PageId pid, const CacheGroup& g, uint64_t block) {
      const storage::Page& p = storage_.page(pid);
      if (!p.live || p.group != g.id) err = label(id) + " holds a dead or foreign page";
      if (rec.active() && p.tier != TierKind::kGpu)
        err = "active " + label(id) + " has a page off the GPU";
      auto& r = refs[pid.value];
      ++(rec.active() ? r.first : r.second);
      if (!rec.active() || g.kind != GroupKind::kAttention) return;
      for (uint32_t k = 0; k < rec.beam_width; ++k) {
        if (rec.groups[g.id.value].pages[block * rec.beam_width + k] == pid &&
            rec.groups[g.id.value].tables[k][block] != static_cast<int32_t>(p.slot.value)) {
          err = label(id) + ": block table disagrees with page " + std::to_string(pid.value);
        }
      }
    });
    for (const GroupState& gs : rec.groups) {
      for (PageId pid : gs.scratch) {  // SWA scratch: LOCKED, only while ACTIVE
        if (!rec.active()) err = label(id) + " keeps scratch pages while not ACTIVE";
        ++refs[pid.value].first;
      }
      for (PageId pid : gs.reserved) {  // states inside a step: LOCKED, only while ACTIVE
        if (pid == kNoPage) continue;
        if (!rec.active()) err = label(id) + " keeps reserved states while not ACTIVE";
        ++refs[pid.value].first;
      }
      for (PageId pid : gs.held) {  // window pages waiting for their commit: always HELD
        if (pid == kNoPage) continue;
        if (!storage_.page(pid).live) err = label(id) + " holds a dead window page";
        ++refs[pid.value].second;
      }
    }
    if (!err.empty()) return err;
  }
  for (uint32_t i = 0; i < storage_.page_capacity(); ++i) {
    const storage::Page& p = storage_.page(PageId(i));
    if (!p.live) continue;
    const auto [a, s] = refs[i];
    if (p.active_refs != a || p.suspended_refs != s) {
      return "page " + std::to_string(i) + " counts (" + std::to_string(p.active_refs) + ", " +
             std::to_string(p.suspended_refs) + ") != holders (" + std::to_string(a) + ", " +
             std::to_string(s) + ")";
    }
  }
  if (live != live_caches_ || active != active_caches_) return "live/active cache counters are off";
  return check_path_holds();
}

// Every resumable hold of a tree node is one ACTIVE cache's, at a node of its commit path.
std::string ManagerCore::check_path_holds() const {
  std::vector<uint32_t> holds(index_.tree().capacity(), 0);
  for (uint32_t id = 0; id < caches_.size(); ++id) {
    const CacheRecord& rec = caches_[id];
    if (!rec.in_use || rec.resumable_hold == kNoNode) continue;
    if (!rec.active()) return label(id) + " holds its path resumable while not ACTIVE";
    if (rec.resumable_hold != rec.hold_point)
      return label(id) + " holds a node other than its hold point";
    ++holds[rec.resumable_hold.value];
  }
  std::string err;
  index_.tree().for_each_node([&](NodeId node, const prefix::Node& n) {
    if (err.empty() && n.resumable_holds != holds[node.value]) {
      err = "tree node " + std::to_string(node.value) + " has " +
            std::to_string(n.resumable_holds) + " resumable holds; the caches hold " +
            std::to_string(holds[node.value]);
    }
  });
  return err;
}

std::string ManagerReads::snapshot() const {
  std::shared_lock lock(core_.mu_);
  std::ostringstream os;
  os << core_.storage_.snapshot();
  for (uint32_t id = 0; id < core_.caches_.size(); ++id) {
    const CacheRecord& rec = core_.caches_[id];
    if (!rec.in_use) continue;
    os << core_.label(id) << " " << cache_state_name(rec.state) << " cap " << rec.capacity
       << " hist " << rec.history << "\n";
    for (const GroupState& gs : rec.groups) {
      os << "  pages";
      for (PageId pid : gs.pages) os << " " << (pid == kNoPage ? -1 : int64_t{pid.value});
      os << " | scratch " << gs.scratch_blocks.begin << ".." << gs.scratch_blocks.end << ":";
      for (PageId pid : gs.scratch) os << " " << pid.value;
      os << " | held from " << gs.held_begin << ":";
      for (PageId pid : gs.held) os << " " << (pid == kNoPage ? -1 : int64_t{pid.value});
      for (const auto& t : gs.tables) {
        os << " | table";
        for (int32_t v : t) os << " " << v;
      }
      os << "\n";
    }
  }
  os << "live " << core_.live_caches_ << " active " << core_.active_caches_ << " tree "
     << core_.index_.tree().size() << "\n";
  os << core_.index_.snapshot();
  return os.str();
}

}  // namespace hybridkv::cache_detail
