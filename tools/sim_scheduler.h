// The scheduler loop of `hybridkv sim` (sim_loop.cc: arrivals, admission, the step and
// preemption; sim_between.cc: what runs between two steps and the step's record). Internal to
// the tools.
#pragma once

#include <unistd.h>

#include <array>
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "sim_internal.h"

namespace hybridkv::tools {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kNoOrder = UINT64_MAX;
// Steps without a newly computed token before the run is declared stuck. A healthy run computes
// tokens every step (every running request decodes or prefills).
constexpr uint64_t kStuckSteps = 1000;

struct Waiting {
  uint64_t index = 0;
  uint64_t order = kNoOrder;  // first-admission order; kNoOrder: never admitted
  uint64_t high_water = 0;    // most tokens ever computed for it
  bool counted = false;       // its reuse is in the report (it computed)
  bool touched = false;       // its prefix was touched (--touch-queued)
  std::shared_ptr<const PromptKeys> keys =
      nullptr;  // hashed when it first came near the queue's head
};

struct Running {
  uint64_t index = 0;
  uint64_t order = 0;
  uint64_t high_water = 0;
  uint64_t generated = 0;
  bool counted = false;  // its reuse is in the report (it computed)
  bool fresh = false;    // joined the running batch in this step
  testing::FakeRequest fake;
};

inline bool older(const Running& a, const Running& b) { return a.order < b.order; }

class Scheduler {
 public:
  Scheduler(const SimOptions& o, const std::vector<TraceRequest>& reqs,
            const std::vector<uint64_t>& bound, HybridCacheManager& h, testing::FakeEngine* engine)
      : o_(o), reqs_(reqs), bound_(bound), h_(h), engine_(engine) {
    longest_ = h.manager().clamp_max_seq_len_for_mem(UINT64_MAX);
    preempt_by_swap_ = h.plan().tiers().size() > 1;  // a colder tier can take suspended pages
    eager_ = o.admission == "eager";
    tty_ = !o.quiet && isatty(STDERR_FILENO);
    c_.peak.assign(h.plan().pool_groups().size(), 0);
  }

  // One iteration: arrivals, resumption, admission and a step; false once the run is over
  // (every request finished, or an error).
  bool tick();
  SimCounters finish_run();

 private:
  template <typename Fn>
  auto timed(SimOp op, Fn&& fn) {
    const auto t0 = Clock::now();
    auto r = fn();
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    const SimOp at = scheduling_ahead_ ? kOpScheduleAhead : op;
    if (at < kOpEvictAhead) manager_us_ += us;
    ops_us_[at] += static_cast<float>(us);
    return r;
  }
  void check(const Status& s, const char* what) {
    if (s.is_ok()) return;
    if (c_.error.empty()) c_.error = std::string(what) + ": " + s.to_string();
    ++c_.mismatches;
  }
  void arrivals();
  // Without a budget (eager admission) before the step; with one, inside it.
  void resume_suspended(uint64_t* budget);
  void admit(uint64_t* budget);
  bool may_resume(uint64_t index);
  void join(Running r, uint64_t* budget);
  bool create(Running& r, const Waiting& w, SimOp op = kOpAdd);
  void count_reuse(Running& r);
  std::shared_ptr<const PromptKeys> hash_ahead(std::span<const int32_t> prompt);
  bool create_next(SimOp op);
  void step();
  // running_[i]'s share of the step; false when it left running_ (finished or preempted).
  bool advance(size_t i, uint64_t& budget);
  // Makes room for `for_request` (preempting newer requests or freeing suspended ones).
  bool preempt_for(const Running& for_request);
  void suspend(Running& victim);
  void recompute(Running victim);
  void finish(Running& r, SimOp op);
  void commit(uint64_t index, SimOp op);  // commit_at_snapshot after a prefill chunk
  void after_launch();
  void record_step();
  // Adds a take_iteration_stats() to the run's totals; returns the pages it evicted.
  uint64_t absorb(const IterationStats& it);
  void rebalance();
  void evict_ahead();
  void admit_ahead();
  void touch_queued();
  void schedule_ahead();
  void prefetch_ahead(uint64_t index, uint64_t& budget);
  void progress(bool last);
  std::string stuck_message() const;

  const SimOptions& o_;
  const std::vector<TraceRequest>& reqs_;
  const std::vector<uint64_t>& bound_;
  HybridCacheManager& h_;
  testing::FakeEngine* engine_;
  uint64_t longest_ = 0;  // the longest request the GPU tier holds
  bool preempt_by_swap_ = false;
  SimCounters c_;
  std::deque<Waiting> waiting_;     // by order, never-admitted requests last in arrival order
  std::deque<Running> admitting_;   // created, waiting for room to resume (oldest first)
  std::vector<Running> running_;    // oldest first
  std::vector<Running> suspended_;  // oldest first
  // --after-launch: requests whose chunk the step computes (committed after its launch), and
  // requests that computed their last token in it (freed after the next step's launch).
  std::vector<uint64_t> to_commit_;
  std::vector<Running> finishing_;
  std::vector<Running> finished_before_;  // finished in the step before: freed in this one
  uint64_t next_arrival_ = 0, finished_ = 0, clock_ms_ = 0, next_order_ = 0;
  uint64_t steps_without_progress_ = 0;
  bool progressed_ = false;
  bool preempted_ = false;  // in this step
  uint64_t joins_ = 0;      // requests that joined in this step
  // --schedule-ahead: while it runs (its calls are timed as kOpScheduleAhead), the requests it
  // joined to the next step, and whether it stopped with requests left that the next step's
  // start could not take either (the cache is the same then): that start admits none.
  bool scheduling_ahead_ = false;
  uint64_t ahead_joins_ = 0;
  bool ahead_blocked_ = false;
  bool eager_ = true;  // --admission eager
  std::string last_refusal_;
  double manager_us_ = 0;
  uint64_t step_evictions_ = 0;  // by the step's own calls (before the work ahead)
  bool descheduled_ = false;     // the OS took the core during the step
  std::array<float, kSimOps> ops_us_{};
  bool tty_ = false;
  Clock::time_point last_progress_ = Clock::now();
};

}  // namespace hybridkv::tools
