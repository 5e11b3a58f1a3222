// KvCache: the per-request object an engine drives every step.
//
// States and transitions (DESIGN §5):
//   create ──> SUSPENDED ──resume──> ACTIVE ──suspend──> SUSPENDED ...
//   any ──close──> CLOSED
// SUSPENDED: the cache's pages are HELD: they may be demoted to colder tiers under pressure but
// never dropped. ACTIVE: every page is LOCKED on the GPU and the block tables are valid.
// resume() is all-or-nothing: it is refused (StatusCode::kRefused) when a GPU pool group's
// utilization, counting what the resume would lock, would exceed max_util_for_resume, and fails
// (kOutOfPages, naming the pool group) when room cannot be made; either way nothing changes.
// resize() grows or shrinks capacity, advances history (which only grows) and releases sliding-
// window blocks that fell out of every window; out of pages, it changes nothing.
//
// Kernel interface: per cache group and beam, a block table of GPU slot ids (int32,
// kBadPageIndex where no page is resident: stale window blocks, or the whole table while
// SUSPENDED); convert slot ids to page indices with StoragePlan::convert_page_indices. For an
// SSM group, state_index() is the GPU slot of the request's state. After resume() or resize(),
// wait for ready_event() before the kernels touch the pages (pages may still be arriving).
//
// Thread-safety: every method takes the manager's mutex; one cache is driven by one thread at a
// time (the spans returned stay valid until the next call on this cache).
// Lifetime: a cache may outlive its KvCacheManager; the pools stay until the last cache is gone.
// Cost: resize() is O(blocks added or released + groups); resume() O(pages of the cache).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/ids.h"
#include "hybridkv/memory.h"
#include "hybridkv/plan.h"
#include "hybridkv/reuse.h"
#include "hybridkv/status.h"

namespace hybridkv {

class KvCacheManager;
class KvCache;
namespace cache_detail {
class ManagerCore;
struct CoreAccess;
}  // namespace cache_detail

// A planned snapshot drop (KvCache::plan_snapshot_drop): a value that names the plan. It may
// outlive the cache that made it (and the manager) and is released on its own; copies name
// the same plan. A handle that is never released keeps its pages in the tree (pinned).
class PlannedDrop {
 public:
  PlannedDrop() = default;  // names no plan: release() reports kNotFound
  // Runs the plan: its pages leave the tree unless another plan still counts on them.
  // kNotFound ("... was already dropped") when this plan was released before.
  [[nodiscard]] Status release() const;
  uint64_t id() const { return id_; }

 private:
  friend class KvCache;
  PlannedDrop(std::shared_ptr<cache_detail::ManagerCore> core, uint64_t id)
      : core_(std::move(core)), id_(id) {}
  std::shared_ptr<cache_detail::ManagerCore> core_;
  uint64_t id_ = 0;
};

// How a commit's SSM snapshot competes for memory (DESIGN §7, issue 35).
enum class SnapshotRole : uint8_t {
  kKept,  // priced like every snapshot; it supersedes the snapshot above it on a path that does
          // not fork between them
  // At a point no request has resumed from yet and none is known to (a periodic one): published
  // demoted, so it goes before every page that is not and is copied down a tier only into free
  // room (offload policy "room"); it supersedes nothing. A match that resumes from it makes it
  // kKept. Snapshots kept only while memory is not short.
  kSpeculative,
};

enum class CacheState : uint8_t { kSuspended, kActive, kClosed };
const char* cache_state_name(CacheState state);

class KvCache {
 public:
  ~KvCache();  // closes the cache if it is still open
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  CacheState state() const;
  uint64_t capacity() const;
  uint64_t history() const;
  uint32_t beam_width() const;

  // Requires: SUSPENDED. On the first resume, `optional_groups` lists the OPTIONAL groups that
  // use their matched pages (each must be OPTIONAL and complete); the others get fresh pages.
  // The choice persists; later resumes ignore the argument.
  [[nodiscard]] Status resume(Stream stream, const std::vector<CacheGroupId>& optional_groups = {});
  // What resume() would answer now (OK, kRefused by the utilization gate, kOutOfPages),
  // changing nothing: a scheduler asks before it commits to a resume, so that a refused
  // resume costs no evictions and no churn.
  [[nodiscard]] Status can_resume(const std::vector<CacheGroupId>& optional_groups = {}) const;
  // Requires: SUSPENDED. Starts onboarding every page of the cache that sits on a colder tier
  // (making GPU room as resume would, without locking anything), so that a later resume() only
  // waits on copies already in flight. The pages stay HELD: pressure before the resume may
  // demote them again. Out of room: kOutOfPages, nothing changes. A cache whose pages are all
  // on the GPU: OK, nothing to do.
  [[nodiscard]] Status prefetch();
  // The same in parts: onboards at most max_pages (>= 1) of those pages and answers how many it
  // onboarded (fewer than max_pages: none is left away), so that a scheduler can spread a long
  // prefix's onboarding over the steps before the resume. Out of room: kOutOfPages, nothing
  // changes; max_pages 0: kInvalidArgument.
  [[nodiscard]] Result<uint64_t> prefetch(uint64_t max_pages);
  // Requires: SUSPENDED. How many of the cache's pages sit on a colder tier now (at most what a
  // resume would bring up; a first resume leaves out the OPTIONAL groups it does not select):
  // a scheduler that resumes a cache only once few are left, prefetching the rest between
  // steps, keeps the onboarding out of its steps.
  [[nodiscard]] Result<uint64_t> pages_away() const;
  // Requires: ACTIVE.
  [[nodiscard]] Status suspend();
  // Requires: ACTIVE; history <= capacity; history >= history().
  [[nodiscard]] Status resize(uint64_t capacity, uint64_t history);
  // Frees every page (committed pages stay in the prefix tree). Idempotent: closing a CLOSED
  // cache returns OK and changes nothing.
  [[nodiscard]] Status close();

  // Block table of a group for a beam (GPU slot ids). Requires: an attention group, beam <
  // beam_width().
  Result<std::span<const int32_t>> block_table(CacheGroupId group, uint32_t beam = 0) const;
  // GPU slot of an SSM group's state (kBadPageIndex while SUSPENDED).
  Result<int32_t> state_index(CacheGroupId group, uint32_t beam = 0) const;
  // A caller-owned index buffer the cache keeps equal to block_table(group, beam) (padded with
  // kBadPageIndex) on every lock and unlock. Requires: large enough for the current capacity;
  // resize fails if the new capacity does not fit. An empty span detaches the buffer.
  [[nodiscard]] Status set_index_buffer(CacheGroupId group, uint32_t beam,
                                        std::span<int32_t> buffer);
  // Eviction priority of blocks [first_block, end_block) in every attention group (lower is
  // evicted first; default 35), applied now and whenever those pages become evictable.
  [[nodiscard]] Status set_block_priority(uint64_t first_block, uint64_t end_block,
                                          int32_t priority);
  // The last copy the cache's pages depend on.
  CopyEvent ready_event() const;

  // --- SWA scratch (ManagerConfig::swa_scratch_reuse) ---
  // Turns scratch on or off for this request from the next resize on (on requires the
  // config's swa_scratch_reuse). While the last step has scratch blocks, the next resize's
  // history must not rewind below that step's capacity - max_rewind_len (kFailedPrecondition).
  // Scratch KV lives only during its step: settle the step (the next resize) before suspend();
  // a cache suspended with scratch blocks keeps its old history and, resumed, gets fresh pages
  // for those blocks, which the engine must compute again.
  [[nodiscard]] Status set_swa_scratch(bool on);
  // The scratch blocks and slots of a window group in the current step (empty when none or not
  // ACTIVE); give it to StoragePlan::convert_page_indices (kPerLayer) with the block table.
  Result<ScratchDesc> scratch(CacheGroupId group) const;

  // --- Prefix reuse (DESIGN §6) ---
  // What create() matched: reused tokens (the cache starts with that history), depths, groups.
  ReuseMatch reuse_match() const;
  // Publishes tokens [committed, committed + tokens.size()) to the prefix tree: full blocks
  // (deduplicated: an existing block's page is adopted and ours freed), and, with
  // commit_min_snapshot or is_end, the partial tail; when the commit ends at history, the SSM
  // states there as snapshots (copied; moved with is_end, after which the cache computes nothing
  // more). Requires: ACTIVE; only computed tokens (end <= history); tokens that overlap the
  // prompt equal it. Out of pages for the copies: nothing changes.
  // `role` says how the snapshot competes for memory (SnapshotRole).
  [[nodiscard]] Status commit(std::span<const int32_t> tokens, bool is_end = false,
                              SnapshotRole role = SnapshotRole::kKept);
  // Publishes the KV of tokens [committed, committed + tokens.size()): full blocks only, no
  // partial tail and no SSM snapshot (issue 12: publishing KV does not wait for a snapshot
  // point; a later commit at a snapshot point adds the states). Same rules as commit().
  [[nodiscard]] Status commit_kv(std::span<const int32_t> tokens);
  uint64_t committed_tokens() const;

  // --- States inside a step (issue 35) ---
  // A kernel that computes the recurrent state at points inside a prefill chunk (a chunked scan
  // has it at every chunk boundary) can hand those states to snapshot commits, so that a
  // snapshot point need not end a chunk. reserve_states() takes one GPU page per publishable
  // SSM group and point, LOCKED for this cache (earlier reservations are released first);
  // reserved_state_slots(group) lists their slots in point order, where the kernel writes the
  // state after that many tokens (the live state's layout); a commit that ends at a reserved
  // point publishes that state as the snapshot there. Points: multiples of tokens_per_block,
  // increasing, in (history, capacity]; beam width 1. kSpeculative reserves the first points
  // whose pages cost no page of value and leaves out the rest; kKept reserves all or fails
  // (kOutOfPages) changing nothing. Returns the points reserved. A commit releases the
  // reservations at or below its end; suspend and close release all. The slots are valid until
  // the next reserve_states, commit, suspend or close of this cache, or the manager's adjust().
  Result<std::vector<uint64_t>> reserve_states(std::span<const uint64_t> points,
                                               SnapshotRole role = SnapshotRole::kSpeculative);
  Result<std::vector<int32_t>> reserved_state_slots(CacheGroupId group) const;
  // No further commits; the cache's place in the tree is no longer pinned.
  [[nodiscard]] Status stop_committing();
  // Plans to release, later, the SSM snapshots at the last commit's endpoint and every page of
  // its sliding windows that a match ending there needs (sink blocks excepted). Several plans
  // on one page are counted: it leaves the tree when the last of them is released. kNotFound
  // when the last commit left no snapshot node.
  [[nodiscard]] Result<PlannedDrop> plan_snapshot_drop();

 private:
  friend class KvCacheManager;
  friend struct cache_detail::CoreAccess;  // the implementation's own layers
  KvCache(std::shared_ptr<cache_detail::ManagerCore> core, uint32_t id)
      : core_(std::move(core)), id_(id) {}
  // Shared with the manager: a cache that outlives its KvCacheManager keeps the pools alive
  // and stays usable until it is destroyed.
  std::shared_ptr<cache_detail::ManagerCore> core_;
  uint32_t id_;
};

}  // namespace hybridkv
