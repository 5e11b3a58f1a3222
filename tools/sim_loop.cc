// The scheduler loop of `hybridkv sim`: arrivals, LIFO resumption of suspended requests,
// admission, one step of chunked prefill (ending chunks at snapshot points) and decode, and
// preemption of the most recently admitted request under memory pressure.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>

#include "sim_internal.h"

namespace hybridkv::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Running {
  uint64_t index;
  uint64_t generated = 0;
  uint64_t admitted_at = 0;  // admission order, for LIFO preemption
  testing::FakeRequest fake;
};

class Scheduler {
 public:
  Scheduler(const SimOptions& o, const std::vector<TraceRequest>& reqs, HybridCacheManager& h,
            testing::FakeEngine* engine)
      : o_(o), reqs_(reqs), h_(h), engine_(engine) {
    c_.peak.assign(h.plan().pool_groups().size(), 0);
  }

  SimCounters run();

 private:
  // Runs fn, adding its wall time to the step's manager time.
  template <typename Fn>
  auto timed(Fn&& fn) {
    const auto t0 = Clock::now();
    auto r = fn();
    manager_us_ += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    return r;
  }
  void check(const Status& s, const char* what) {
    if (!s.is_ok() && c_.error.empty()) c_.error = std::string(what) + ": " + s.to_string();
    if (!s.is_ok()) ++c_.mismatches;
  }
  std::vector<int32_t> all_tokens(uint64_t index) const;
  void resume_suspended();
  void admit_new();
  // One request's share of the step; false when it was preempted (the caller retries i).
  bool advance(size_t& i, uint64_t& budget);
  void preempt_for(size_t& i);
  void finish(size_t i, KvCache& cache);
  void record_step();
  void progress();

  const SimOptions& o_;
  const std::vector<TraceRequest>& reqs_;
  HybridCacheManager& h_;
  testing::FakeEngine* engine_;
  SimCounters c_;
  std::deque<uint64_t> waiting_;
  std::vector<Running> running_;
  std::vector<Running> suspended_;  // a stack: last in, first out
  uint64_t next_arrival_ = 0, finished_ = 0, clock_ms_ = 0, admitted_ = 0;
  double manager_us_ = 0;
  bool tty_ = false;
  Clock::time_point last_progress_ = Clock::now();
};

std::vector<int32_t> Scheduler::all_tokens(uint64_t index) const {
  std::vector<int32_t> t(reqs_[index].prompt);
  t.insert(t.end(), reqs_[index].output.begin(),
           reqs_[index].output.begin() + static_cast<int64_t>(reqs_[index].output_length));
  return t;
}

// Suspended requests come back first, last in first out.
void Scheduler::resume_suspended() {
  while (!suspended_.empty() && running_.size() < o_.max_batch) {
    Running& r = suspended_.back();
    if (!timed([&] { return h_.resume(r.index); }).is_ok()) break;
    ++c_.resumes;
    if (engine_) check(engine_->verify(*h_.cache(r.index), r.fake), "verify after resume");
    running_.push_back(std::move(r));
    suspended_.pop_back();
  }
}

void Scheduler::admit_new() {
  while (suspended_.empty() && !waiting_.empty() && running_.size() < o_.max_batch) {
    const uint64_t index = waiting_.front();
    const Status added = timed([&] { return h_.add_request(index, reqs_[index].prompt); });
    if (!added.is_ok()) {
      c_.error = "add_request: " + added.to_string();
      return;
    }
    Running r;
    r.index = index;
    r.admitted_at = admitted_++;
    c_.prompt_tokens += reqs_[index].input_length;
    c_.reused_tokens += h_.cache(index)->reuse_match().reused_tokens;
    if (engine_) {
      r.fake.tokens = {all_tokens(index)};
      testing::FakeEngine::adopt_reuse(*h_.cache(index), r.fake);
    }
    waiting_.pop_front();
    if (!timed([&] { return h_.resume(index); }).is_ok()) {
      suspended_.push_back(std::move(r));  // no room now: it waits on the stack
      return;
    }
    if (engine_) check(engine_->verify(*h_.cache(index), r.fake), "verify after admission");
    running_.push_back(std::move(r));
  }
}

// Memory pressure: the most recently admitted request gives way (last in, first out).
void Scheduler::preempt_for(size_t& i) {
  auto victim = std::max_element(
      running_.begin(), running_.end(),
      [](const Running& a, const Running& b) { return a.admitted_at < b.admitted_at; });
  check(timed([&] { return h_.suspend(victim->index); }), "suspend");
  ++c_.suspends;
  const bool self = victim == running_.begin() + static_cast<int64_t>(i);
  suspended_.push_back(std::move(*victim));
  running_.erase(victim);
  if (!self && static_cast<size_t>(victim - running_.begin()) < i) --i;
}

void Scheduler::finish(size_t i, KvCache& cache) {
  // Generated tokens are not committed: in these traces a later prompt never holds an earlier
  // request's output (it arrives as new hash ids), so publishing it would only take tree memory
  // from the prompts.
  Running& r = running_[i];
  if (engine_) check(engine_->verify(cache, r.fake), "verify before free");
  check(timed([&] { return h_.free_request(r.index); }), "free");
  ++finished_;
  running_.erase(running_.begin() + static_cast<int64_t>(i));
}

bool Scheduler::advance(size_t& i, uint64_t& budget) {
  Running& r = running_[i];
  const TraceRequest& t = reqs_[r.index];
  KvCache& cache = *h_.cache(r.index);
  const uint64_t history = cache.history();
  const bool prefill = history < t.input_length;
  if (prefill && budget == 0) {
    ++i;
    return true;
  }
  uint64_t upto = history + 1;
  if (prefill) {
    upto = std::min(*h_.next_snapshot_point(r.index), history + budget);
    budget -= upto - history;
  }
  const Status s = timed([&] { return h_.resize(r.index, upto, engine_ ? history : upto); });
  if (s.code() == StatusCode::kOutOfPages) {
    preempt_for(i);
    return false;  // retry (or move on when the victim was this request)
  }
  if (!s.is_ok()) {
    c_.error = "resize: " + s.to_string();
    return false;
  }
  if (engine_) {
    check(engine_->write_step(cache, r.fake, upto), "step");
    check(timed([&] { return h_.resize(r.index, upto, upto); }), "resize");
  }
  if (prefill) {
    const Status committed = timed([&] { return h_.commit_at_snapshot(r.index); });
    if (!committed.is_ok() && committed.code() != StatusCode::kOutOfPages)
      check(committed, "commit");  // full: not published
  } else if (++r.generated >= t.output_length) {
    finish(i, cache);
    return true;
  }
  ++i;
  return true;
}

void Scheduler::record_step() {
  const IterationStats it = h_.manager().take_iteration_stats();
  c_.bytes_offloaded += it.bytes_offloaded;
  c_.bytes_onboarded += it.bytes_onboarded;
  c_.pages_dropped += it.pages_dropped;
  c_.device_copies += it.device_copies;
  const StorageStats st = h_.manager().storage_stats();
  uint64_t used = 0, total = 0;
  for (const PoolGroupStorage& pg : st.tiers[0].pool_groups) {
    const uint64_t slot_bytes = h_.plan().pool_group(pg.pool_group).slot_bytes;
    uint64_t& peak = c_.peak[pg.pool_group.value];
    peak = std::max(peak, pg.total_slots - pg.free_slots);
    used += (pg.total_slots - pg.free_slots) * slot_bytes;
    total += pg.total_slots * slot_bytes;
  }
  c_.step_us.push_back(manager_us_);
  if (c_.steps % 64 == 0) {
    c_.samples.push_back(
        {c_.steps, c_.prompt_tokens ? static_cast<double>(c_.reused_tokens) / c_.prompt_tokens : 0,
         total ? static_cast<double>(used) / total : 0});
  }
  ++c_.steps;
  clock_ms_ += o_.step_ms;
}

void Scheduler::progress() {
  if (o_.quiet || Clock::now() - last_progress_ <= std::chrono::milliseconds(tty_ ? 200 : 10000))
    return;
  last_progress_ = Clock::now();
  const double done = static_cast<double>(finished_) / reqs_.size();
  const double reuse = c_.prompt_tokens ? 100.0 * c_.reused_tokens / c_.prompt_tokens : 0.0;
  if (tty_) {
    const int bar = static_cast<int>(done * 30);
    std::fprintf(stderr, "\r[%-30s] %5.1f%%  %llu/%zu requests  reuse %.1f%%",
                 std::string(bar, '#').c_str(), done * 100,
                 static_cast<unsigned long long>(finished_), reqs_.size(), reuse);
  } else {
    std::fprintf(stderr, "sim: %llu/%zu requests done, step %llu, reuse %.1f%%\n",
                 static_cast<unsigned long long>(finished_), reqs_.size(),
                 static_cast<unsigned long long>(c_.steps), reuse);
  }
}

SimCounters Scheduler::run() {
  tty_ = !o_.quiet && isatty(STDERR_FILENO);
  while (finished_ < reqs_.size() && c_.error.empty()) {
    manager_us_ = 0;
    while (next_arrival_ < reqs_.size() &&
           (o_.arrival == "asap" || reqs_[next_arrival_].timestamp_ms <= clock_ms_)) {
      waiting_.push_back(next_arrival_++);
    }
    resume_suspended();
    admit_new();
    if (!c_.error.empty()) break;
    if (running_.empty() && suspended_.empty() && waiting_.empty() &&
        next_arrival_ < reqs_.size()) {
      clock_ms_ = reqs_[next_arrival_].timestamp_ms;  // idle until the next arrival
      continue;
    }
    if (running_.empty() && !suspended_.empty()) {
      c_.error =
          "deadlock: a suspended request cannot resume with nothing running (the GPU "
          "quota holds less than one request)";
      break;
    }
    // One step: prefill chunks under the token budget, one decode token per decoding request.
    uint64_t budget = o_.max_tokens_per_step;
    for (size_t i = 0; i < running_.size() && c_.error.empty();) advance(i, budget);
    if (!c_.error.empty()) break;
    record_step();
    progress();
  }
  if (tty_) std::fprintf(stderr, "\n");
  return std::move(c_);
}

}  // namespace

SimCounters run_scheduler(const SimOptions& options, const std::vector<TraceRequest>& requests,
                          HybridCacheManager& manager, testing::FakeEngine* engine) {
  return Scheduler(options, requests, manager, engine).run();
}

}  // namespace hybridkv::tools
