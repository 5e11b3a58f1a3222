// The scheduler loop of `hybridkv sim`, as a serving engine runs one: arrivals, resumption of
// preempted requests oldest first, admission, one step of chunked prefill (chunks end at snapshot
// points) and decode, and preemption under memory pressure.
//
// Progress is guaranteed: requests keep the priority of their first admission; a request is only
// ever preempted for an older one (or for itself), so the oldest running request always gets
// memory: the newest running requests give way first; then suspended requests whose pages sit
// on the GPU are freed for recompute; requests longer than the GPU tier can hold for one request
// are skipped (and reported). Resumption and admission ask can_resume() first, so a refusal
// costs nothing. A window of steps in which no request computed a new token stops the run with
// an error naming the cause, whatever went wrong.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "sim_scheduler.h"
#include "sim_step_times.h"

namespace hybridkv::tools {

void Scheduler::arrivals() {
  while (next_arrival_ < reqs_.size() &&
         (o_.arrival == "asap" || reqs_[next_arrival_].timestamp_ms <= clock_ms_)) {
    const TraceRequest& t = reqs_[next_arrival_];
    if (t.input_length + t.output_length > longest_) {
      ++c_.skipped;  // it could never fit: reported, not run
      c_.skipped_longest = std::max(c_.skipped_longest, t.input_length + t.output_length);
      ++finished_;
    } else {
      waiting_.push_back(Waiting{.index = next_arrival_});
    }
    ++next_arrival_;
  }
}

// Preempted requests come back oldest first, when they can.
void Scheduler::resume_suspended(uint64_t* budget) {
  while (!suspended_.empty() && running_.size() < o_.max_batch && (!budget || *budget > 0)) {
    Running& r = suspended_.front();
    if (!may_resume(r.index)) return;
    check(timed(kOpResume, [&] { return h_.resume(r.index); }), "resume");
    ++c_.resumes;
    if (engine_) check(engine_->verify(*h_.cache(r.index), r.fake), "verify after resume");
    Running joined = std::move(r);
    suspended_.erase(suspended_.begin());
    join(std::move(joined), budget);
  }
}

// Whether a preempted or new request resumes in this step: can_resume (a refusal costs
// nothing), and with --onboard-in-step no more pages away than that (the others come up
// between steps first).
bool Scheduler::may_resume(uint64_t index) {
  const KvCache& cache = *h_.cache(index);
  const Status can = timed(kOpCanResume, [&] { return cache.can_resume(); });
  if (!can.is_ok()) {
    last_refusal_ = can.message();
    return false;
  }
  if (o_.onboard_in_step == 0) return true;
  const Result<uint64_t> away = timed(kOpCanResume, [&] { return cache.pages_away(); });
  check(away.status(), "pages_away");
  if (!away.is_ok() || *away <= o_.onboard_in_step) return true;
  ++c_.onboard_waits;
  last_refusal_ = std::to_string(*away) + " pages still to come up from a colder tier";
  return false;
}

// A resumed or admitted request runs; with a budget (--admission budget) it computes in this
// step, after the requests that were running.
void Scheduler::join(Running r, uint64_t* budget) {
  const uint64_t index = r.index;
  r.fresh = true;
  uint64_t& joins = scheduling_ahead_ ? ahead_joins_ : joins_;  // ahead: the next step's
  c_.most_joins = std::max(c_.most_joins, ++joins);
  running_.push_back(std::move(r));
  if (!budget) return;
  std::sort(running_.begin(), running_.end(), older);
  const auto it = std::find_if(running_.begin(), running_.end(),
                               [&](const Running& x) { return x.index == index; });
  (void)advance(static_cast<size_t>(it - running_.begin()), *budget);
}

bool Scheduler::create(Running& r, const Waiting& w, SimOp op) {
  const TraceRequest& t = reqs_[w.index];
  std::vector<int32_t> prompt = prompt_tokens(t);
  if (h_.serving().shared.store && w.order == kNoOrder) {  // a new request: the shared tier first
    const auto start = Clock::now();
    (void)h_.manager().fetch_shared({}, prompt);  // a miss (or no room) is not an error
    c_.shared_fetch_us += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  std::shared_ptr<const PromptKeys> keys = w.keys ? w.keys : hash_ahead(prompt);
  // The fake engine keeps its own copy; the manager takes the prompt.
  std::vector<int32_t> fake_tokens = engine_ ? prompt : std::vector<int32_t>{};
  const Status added =
      timed(op, [&] { return h_.add_request(w.index, std::move(prompt), {}, std::move(keys)); });
  if (!added.is_ok()) {
    c_.error = "add_request: " + added.to_string();
    return false;
  }
  r = Running{};
  r.index = w.index;
  r.high_water = w.high_water;
  r.order = w.order;
  r.counted = w.counted;
  if (w.order == kNoOrder) r.order = next_order_++;
  if (engine_) {
    r.fake.tokens = {std::move(fake_tokens)};
    const std::vector<int32_t> output = output_tokens(t);
    r.fake.tokens[0].insert(r.fake.tokens[0].end(), output.begin(), output.end());
    testing::FakeEngine::adopt_reuse(*h_.cache(w.index), r.fake);
  }
  return true;
}

// The report counts a request's reuse once, when it first computes: what a request matched
// and gave up before computing anything (preempted for recompute) was never reused.
void Scheduler::count_reuse(Running& r) {
  r.counted = true;
  c_.prompt_tokens += reqs_[r.index].input_length;
  const ReuseMatch& m = h_.cache(r.index)->reuse_match();
  c_.reused_tokens += m.reused_tokens;
  c_.tree_tokens += m.divergence_tokens;
  c_.kv_tokens += m.hybrid_tokens;
  c_.dropped_snapshot_tokens += m.dropped_snapshot_tokens;
  c_.bound_tokens += bound_[r.index];
}

// Keys hashed when the request arrives, off the step (an engine's frontend thread).
std::shared_ptr<const PromptKeys> Scheduler::hash_ahead(std::span<const int32_t> prompt) {
  const auto start = Clock::now();
  std::shared_ptr<const PromptKeys> keys = h_.manager().hash_prompt({}, prompt);
  c_.hash_ahead_us += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  return keys;
}

// The first waiting request, created at the back of admitting_ (timed as `op`).
bool Scheduler::create_next(SimOp op) {
  Running r;
  if (!create(r, waiting_.front(), op)) return false;
  waiting_.pop_front();
  admitting_.push_back(std::move(r));
  return true;
}

// New requests only while no preempted request waits, and only what can resume now.
void Scheduler::admit(uint64_t* budget) {
  while (suspended_.empty() && running_.size() < o_.max_batch &&
         (!admitting_.empty() || !waiting_.empty()) && (!budget || *budget > 0) &&
         c_.error.empty()) {
    if (admitting_.empty() && !create_next(kOpAdd)) return;
    Running& r = admitting_.front();
    if (!may_resume(r.index)) {
      ++c_.failed_admissions;
      return;
    }
    check(timed(kOpResume, [&] { return h_.resume(r.index); }), "resume at admission");
    if (engine_) check(engine_->verify(*h_.cache(r.index), r.fake), "verify after admission");
    Running joined = std::move(r);
    admitting_.pop_front();
    join(std::move(joined), budget);
  }
}

void Scheduler::suspend(Running& victim) {
  preempted_ = true;
  check(timed(kOpSuspend, [&] { return h_.suspend(victim.index); }), "suspend");
  ++c_.suspends;
  suspended_.push_back(std::move(victim));
  std::sort(suspended_.begin(), suspended_.end(), older);
}

// The request is freed (its committed blocks stay in the tree) and admitted again later.
void Scheduler::recompute(Running victim) {
  preempted_ = true;
  check(timed(kOpFree, [&] { return h_.free_request(victim.index); }), "free for recompute");
  ++c_.recomputes;
  const Waiting w{.index = victim.index,
                  .order = victim.order,
                  .high_water = victim.high_water,
                  .counted = victim.counted};
  auto at = std::upper_bound(waiting_.begin(), waiting_.end(), w,
                             [](const Waiting& a, const Waiting& b) { return a.order < b.order; });
  waiting_.insert(at, w);
}

bool Scheduler::preempt_for(const Running& for_request) {
  // Newer running requests first (never an older one), newest first.
  if (!running_.empty() && running_.back().order > for_request.order) {
    Running victim = std::move(running_.back());
    running_.pop_back();
    if (preempt_by_swap_) {
      suspend(victim);
    } else {
      recompute(std::move(victim));
    }
    return true;
  }
  // Then requests whose pages wait on the GPU: a newer one being admitted, suspended ones.
  if (!admitting_.empty() && admitting_.back().order > for_request.order) {
    Running victim = std::move(admitting_.back());
    admitting_.pop_back();
    recompute(std::move(victim));
    return true;
  }
  if (!suspended_.empty() && suspended_.back().order > for_request.order) {
    Running victim = std::move(suspended_.back());
    suspended_.pop_back();
    recompute(std::move(victim));
    return true;
  }
  return false;
}

void Scheduler::finish(Running& r, SimOp op) {
  // Generated tokens are committed only with the `answer` policy: in Mooncake traces a later
  // prompt never holds an earlier request's output (it arrives as new hash ids).
  if (h_.serving().snapshots.answer_end) {
    const std::vector<int32_t> output = output_tokens(reqs_[r.index]);
    const Status s = timed(op, [&] { return h_.commit_answer(r.index, output); });
    if (!s.is_ok() && s.code() != StatusCode::kOutOfPages) check(s, "commit answer");
  }
  if (engine_) check(engine_->verify(*h_.cache(r.index), r.fake), "verify before free");
  check(timed(op, [&] { return h_.free_request(r.index); }), "free");
  ++finished_;
}

bool Scheduler::advance(size_t i, uint64_t& budget) {
  Running& r = running_[i];  // preempt_for only removes newer requests, behind it
  const TraceRequest& t = reqs_[r.index];
  KvCache& cache = *h_.cache(r.index);
  const uint64_t history = cache.history();
  const bool prefill = history < t.input_length;
  const bool fresh = std::exchange(r.fresh, false);
  if (prefill && budget == 0) {
    if (fresh) ++c_.idle_joins;
    return true;
  }
  if (!r.counted) count_reuse(r);
  uint64_t upto = history + 1;
  if (prefill) upto = std::min(*h_.next_snapshot_point(r.index), history + budget);
  // The kernel writes states inside the chunk: history advances after the step, as with an
  // engine (without one the sim advances it with the capacity).
  const bool chunk_states = prefill && h_.serving().snapshots.chunk_states;
  const bool after_step = engine_ || chunk_states;
  for (;;) {
    const Status s =
        timed(kOpResize, [&] { return h_.resize(r.index, upto, after_step ? history : upto); });
    if (s.is_ok()) break;
    if (s.code() != StatusCode::kOutOfPages) {
      c_.error = "resize: " + s.to_string();
      return true;
    }
    last_refusal_ = s.message();
    if (!preempt_for(r)) {
      // Nothing newer holds memory. A prefill chunk that does not fit is halved (down to one
      // block) before the request gives way itself: a smaller step can still make progress.
      const uint64_t tpb = h_.plan().config().tokens_per_block;
      if (prefill && upto - history > tpb) {
        upto = history + std::max<uint64_t>(tpb, (upto - history) / 2);
        continue;
      }
      // Nothing fits: this request is the newest and gives way itself.
      Running self = std::move(r);
      running_.erase(running_.begin() + static_cast<int64_t>(i));
      if (preempt_by_swap_) {
        suspend(self);
      } else {
        recompute(std::move(self));
      }
      return false;
    }
  }
  if (prefill) budget -= upto - history;
  std::vector<ChunkState> states;
  if (chunk_states) {
    Result<std::vector<ChunkState>> reserved =
        timed(kOpResize, [&] { return h_.reserve_chunk_states(r.index, upto); });
    check(reserved.status(), "reserve chunk states");
    states = std::move(reserved).value();
  }
  if (engine_) {
    std::vector<uint64_t> points;
    std::vector<int32_t> slots;
    for (const ChunkState& s : states) points.push_back(s.point), slots.push_back(s.state_index);
    if (!states.empty()) engine_->write_states_at(cache, r.fake, *h_.state_group(), points, slots);
    check(engine_->write_step(cache, r.fake, upto), "step");
  }
  if (after_step) check(timed(kOpResize, [&] { return h_.resize(r.index, upto, upto); }), "resize");
  if (upto > r.high_water) {
    r.high_water = upto;
    progressed_ = true;
  }
  if (prefill) {
    if (o_.after_launch) {
      to_commit_.push_back(r.index);
    } else {
      commit(r.index, kOpCommit);
    }
  } else if (++r.generated >= t.output_length) {
    if (o_.after_launch) {
      finishing_.push_back(std::move(r));
    } else {
      finish(r, kOpFree);
    }
    running_.erase(running_.begin() + static_cast<int64_t>(i));
    return false;
  }
  return true;
}

void Scheduler::commit(uint64_t index, SimOp op) {
  const Status committed = timed(op, [&] { return h_.commit_at_snapshot(index); });
  if (!committed.is_ok() && committed.code() != StatusCode::kOutOfPages)
    check(committed, "commit");  // full: not published
}

// --after-launch, while the GPU computes the step: its chunks are committed (a request
// preempted later in the step, by an older one that joined, keeps its chunk uncommitted), the
// requests the step before finished are freed (their last token is in by now; pages freed
// while the step that reads them runs could be written by a copy ahead) and the pool groups
// are rebalanced.
void Scheduler::after_launch() {
  if (!o_.after_launch) return;
  for (uint64_t index : to_commit_) {
    const bool running = std::any_of(running_.begin(), running_.end(),
                                     [&](const Running& r) { return r.index == index; });
    if (running) commit(index, kOpCommitAfter);
  }
  to_commit_.clear();
  for (Running& r : finished_before_) finish(r, kOpFreeAfter);
  finished_before_ = std::move(finishing_);
  finishing_.clear();
  rebalance();
}

// One step: prefill chunks under the token budget, one decode token per decoding request,
// oldest requests first; with --admission budget, then the requests that join while tokens
// are left.
void Scheduler::step() {
  std::sort(running_.begin(), running_.end(), older);
  uint64_t budget = o_.max_tokens_per_step;
  preempted_ = false;
  for (size_t i = 0; i < running_.size() && c_.error.empty();) {
    if (advance(i, budget)) ++i;
  }
  if (eager_ || preempted_ || !c_.error.empty()) return;
  resume_suspended(&budget);
  admit(&budget);
}

bool Scheduler::tick() {
  if (finished_ >= reqs_.size() || !c_.error.empty()) return false;
  manager_us_ = 0;
  ops_us_ = {};
  joins_ = std::exchange(ahead_joins_, 0);
  const uint64_t switches = involuntary_switches();
  arrivals();
  if (eager_ && !std::exchange(ahead_blocked_, false)) {
    resume_suspended(nullptr);
    admit(nullptr);
  }
  if (!c_.error.empty()) return false;
  if (running_.empty() && suspended_.empty() && admitting_.empty() && waiting_.empty() &&
      finishing_.empty() && finished_before_.empty()) {
    if (next_arrival_ < reqs_.size()) clock_ms_ = reqs_[next_arrival_].timestamp_ms;
    return true;  // idle until the next arrival (or done: every request was skipped)
  }
  step();
  if (!c_.error.empty()) return false;
  if (!o_.after_launch) rebalance();
  descheduled_ = involuntary_switches() != switches;
  step_evictions_ = absorb(h_.manager().take_iteration_stats());  // the step's own
  after_launch();
  evict_ahead();
  admit_ahead();
  touch_queued();
  schedule_ahead();
  record_step();
  if (steps_without_progress_ >= kStuckSteps) c_.error = stuck_message();
  progress(false);
  return c_.error.empty();
}

SimCounters Scheduler::finish_run() {
  for (const TierStorage& t : h_.manager().storage_stats().tiers) {
    c_.end_slots.emplace_back();
    for (const PoolGroupStorage& pg : t.pool_groups) c_.end_slots.back().push_back(pg.total_slots);
  }
  if (c_.error.empty()) {
    c_.samples.push_back({c_.steps, c_.reused_tokens, c_.bound_tokens, {}});
    progress(true);
  } else if (tty_) {
    std::fprintf(stderr, "\n");
  }
  return std::move(c_);
}

SchedulerRun::SchedulerRun(const SimOptions& options, const std::vector<TraceRequest>& requests,
                           const std::vector<uint64_t>& bound, HybridCacheManager& manager,
                           testing::FakeEngine* engine)
    : s_(std::make_unique<Scheduler>(options, requests, bound, manager, engine)) {}
SchedulerRun::~SchedulerRun() = default;
bool SchedulerRun::tick() { return s_->tick(); }
SimCounters SchedulerRun::finish() { return s_->finish_run(); }

SimCounters run_scheduler(const SimOptions& options, const std::vector<TraceRequest>& requests,
                          const std::vector<uint64_t>& bound, HybridCacheManager& manager,
                          testing::FakeEngine* engine) {
  SchedulerRun run(options, requests, bound, manager, engine);
  while (run.tick()) {
  }
  return run.finish();
}

}  // namespace hybridkv::tools
