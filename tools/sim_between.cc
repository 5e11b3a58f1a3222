// Between two steps of the sim's scheduler (sim_scheduler.h): the rebalancing the scheduler
// allows, the work done while the GPU computes (eviction and onboarding ahead, off the step's
// critical path), and the step's record and progress line.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "sim_scheduler.h"

namespace hybridkv::tools {

// One budget: the scheduler lets the manager move slots between pool groups between steps.
void Scheduler::rebalance() {
  if (!h_.serving().policies.rebalancing()) return;
  KvCacheManager& m = h_.manager();
  const SimOp op = o_.after_launch ? kOpAdjustAfter : kOpAdjust;
  if (!timed(op, [&] { return m.need_adjustment(); })) return;
  const Result<bool> moved = timed(op, [&] { return m.adjust(); });
  check(moved.status(), "adjust");
  if (moved.is_ok() && *moved) ++c_.adjustments;
}

// While the GPU computes the step: room for the next one.
void Scheduler::evict_ahead() {
  if (o_.evict_ahead == 0) return;
  check(timed(kOpEvictAhead, [&] { return h_.evict_ahead(o_.evict_ahead); }).status(),
        "evict_ahead");
}

// While the GPU computes the step: the next resumptions' and admission's away pages come up,
// so that their resumes at the next step find them on the GPU. Only a request that could
// resume now is prefetched (pages brought up for one that waits would only be demoted again).
void Scheduler::admit_ahead() {
  if (o_.admit_ahead == 0) return;
  uint64_t budget = o_.admit_ahead;
  size_t room = o_.max_batch > running_.size() ? o_.max_batch - running_.size() : 0;
  for (size_t i = 0; i < suspended_.size() && room > 0 && budget > 0; ++i, --room)
    prefetch_ahead(suspended_[i].index, budget);
  if (!suspended_.empty() || room == 0 || budget == 0) return;
  // The next admissions' requests, created now, each while the one before could resume (and
  // while the manager's bound on living caches leaves room for one more).
  const std::optional<uint32_t> most = h_.plan().config().max_live_kv_caches;
  std::optional<uint64_t> live;  // read once, only if a request is to be created
  for (size_t i = 0; i < std::min<uint64_t>(room, o_.create_ahead) && budget > 0; ++i) {
    if (i == admitting_.size()) {
      if (waiting_.empty()) return;
      if (!live) live = h_.manager().storage_stats().live_caches;
      if ((most && *live >= *most) || !create_next(kOpAdmitAhead)) return;
      ++*live;
      ++c_.created_ahead;
      c_.most_created_ahead = std::max<uint64_t>(c_.most_created_ahead, admitting_.size());
    }
    prefetch_ahead(admitting_[i].index, budget);
  }
}

// While the GPU computes the step: the prefixes of the next --touch-queued waiting requests
// become the most recently used (KvCacheManager::touch_reuse), each once as it comes near the
// head of the queue, so that the requests admitted before them do not evict them first.
void Scheduler::touch_queued() {
  const size_t n = std::min<size_t>(o_.touch_queued, waiting_.size());
  for (size_t i = 0; i < n; ++i) {
    Waiting& w = waiting_[i];
    if (w.touched) continue;
    const std::vector<int32_t> prompt = prompt_tokens(reqs_[w.index]);
    if (!w.keys) w.keys = hash_ahead(prompt);
    check(timed(kOpTouch, [&] { return h_.manager().touch_reuse({}, prompt, w.keys.get()); })
              .status(),
          "touch_reuse");
    w.touched = true;
  }
}

// --schedule-ahead, while the GPU computes the step: the next step's resumptions and admissions,
// last of the work ahead, so that they are the ones its start would make. Where they stop with
// requests left (the batch is full, or the first in line cannot resume), the start could take
// none of those either and admits nothing; only when every request was taken may requests that
// arrive in between join at the start.
void Scheduler::schedule_ahead() {
  if (!o_.schedule_ahead || !eager_ || !c_.error.empty()) return;
  scheduling_ahead_ = true;
  resume_suspended(nullptr);
  admit(nullptr);
  scheduling_ahead_ = false;
  ahead_blocked_ = running_.size() >= o_.max_batch || !suspended_.empty() || !admitting_.empty() ||
                   !waiting_.empty();
}

void Scheduler::prefetch_ahead(uint64_t index, uint64_t& budget) {
  KvCache& cache = *h_.cache(index);
  if (!timed(kOpAdmitAhead, [&] { return cache.can_resume(); }).is_ok()) {
    budget = 0;  // it waits for room: so does every later one
    return;
  }
  const Result<uint64_t> moved = timed(kOpAdmitAhead, [&] { return cache.prefetch(budget); });
  if (!moved.is_ok()) {  // no room for them now: the resume will find out
    budget = 0;
    return;
  }
  c_.pages_prefetched += *moved;
  budget -= *moved;
}

uint64_t Scheduler::absorb(const IterationStats& it) {
  c_.bytes_offloaded += it.bytes_offloaded;
  c_.bytes_onboarded += it.bytes_onboarded;
  c_.bytes_offload_cancelled += it.bytes_offload_cancelled;
  c_.bytes_copies_kept += it.bytes_copies_kept;
  if (c_.tier_moves.size() < it.tiers.size()) c_.tier_moves.resize(it.tiers.size());
  for (size_t t = 0; t < it.tiers.size(); ++t) c_.tier_moves[t] += it.tiers[t];
  c_.pages_dropped += it.pages_dropped;
  c_.device_copies += it.device_copies;
  return it.pages_offloaded + it.pages_returned_to_copy + it.pages_dropped;
}

void Scheduler::record_step() {
  (void)absorb(h_.manager().take_iteration_stats());  // the work ahead's
  const StorageStats st = h_.manager().storage_stats();
  Sample sample{c_.steps, c_.reused_tokens, c_.bound_tokens, {}};
  for (const PoolGroupStorage& pg : st.tiers[0].pool_groups) {
    const uint64_t used = pg.total_slots - pg.free_slots;
    uint64_t& peak = c_.peak[pg.pool_group.value];
    peak = std::max(peak, used);
    sample.gpu_used.push_back(pg.total_slots ? static_cast<double>(used) / pg.total_slots : 0);
  }
  c_.step_us.push_back(manager_us_);
  c_.step_ops_us.push_back(ops_us_);
  c_.step_evictions.push_back(static_cast<uint32_t>(step_evictions_));
  c_.step_descheduled.push_back(descheduled_);
  if (c_.steps % 64 == 0) c_.samples.push_back(std::move(sample));
  ++c_.steps;
  clock_ms_ += o_.step_ms;
  steps_without_progress_ = progressed_ ? 0 : steps_without_progress_ + 1;
  progressed_ = false;
}

void Scheduler::progress(bool last) {
  if (o_.quiet) return;
  const auto every = std::chrono::milliseconds(tty_ ? 200 : 5000);
  if (!last && Clock::now() - last_progress_ <= every) return;
  last_progress_ = Clock::now();
  const double done = reqs_.empty() ? 1 : static_cast<double>(finished_) / reqs_.size();
  const double reuse = c_.prompt_tokens ? 100.0 * c_.reused_tokens / c_.prompt_tokens : 0.0;
  const unsigned long long finished = finished_, steps = c_.steps;
  if (tty_) {
    const int bar = static_cast<int>(done * 30);
    std::fprintf(stderr, "\r[%-30s] %5.1f%%  %llu/%zu requests  step %llu  reuse %.1f%%%s",
                 std::string(bar, '#').c_str(), done * 100, finished, reqs_.size(), steps, reuse,
                 last ? "\n" : "");
  } else {
    std::fprintf(stderr, "sim: %llu/%zu requests done (%.0f%%), step %llu, reuse %.1f%%\n",
                 finished, reqs_.size(), done * 100, steps, reuse);
  }
}

std::string Scheduler::stuck_message() const {
  return "no request computed a new token in " + std::to_string(kStuckSteps) + " steps (" +
         std::to_string(running_.size()) + " running, " + std::to_string(suspended_.size()) +
         " preempted, " + std::to_string(waiting_.size()) +
         " waiting; last refusal: " + (last_refusal_.empty() ? "none" : last_refusal_) +
         "): the GPU tier cannot hold what this traffic needs at once; raise --gpu-quota or "
         "lower --max-batch";
}

}  // namespace hybridkv::tools
