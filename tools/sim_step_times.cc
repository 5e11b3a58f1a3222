// The manager CPU time of `hybridkv sim`'s steps (sim_step_times.h).
#include "sim_step_times.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

namespace hybridkv::tools {
namespace {

double at(const std::vector<double>& sorted, size_t per_mille) {
  return sorted.empty() ? 0 : sorted[std::min(sorted.size() - 1, sorted.size() * per_mille / 1000)];
}

double percentile(std::vector<double> v, size_t per_mille) {
  std::sort(v.begin(), v.end());
  return at(v, per_mille);
}

double share_over_slow(const std::vector<double>& sorted) {
  if (sorted.empty()) return 0;
  const auto slow = std::upper_bound(sorted.begin(), sorted.end(), kSlowStepUs);
  return static_cast<double>(sorted.end() - slow) / sorted.size();
}

}  // namespace

uint64_t involuntary_switches() {
  rusage u{};
  if (getrusage(RUSAGE_THREAD, &u) != 0) return 0;
  return static_cast<uint64_t>(u.ru_nivcsw);
}

StepTimes step_times(const SimCounters& c) {
  if (c.step_us.empty()) return {};
  std::vector<double> us = c.step_us, undisturbed;
  for (size_t s = 0; s < c.step_us.size(); ++s) {
    if (s < c.step_descheduled.size() && c.step_descheduled[s]) continue;
    undisturbed.push_back(c.step_us[s]);
  }
  std::sort(us.begin(), us.end());
  std::sort(undisturbed.begin(), undisturbed.end());
  StepTimes t{at(us, 500), at(us, 900), at(us, 990), us.back()};
  t.over_slow = share_over_slow(us);
  t.descheduled = us.size() - undisturbed.size();
  t.undisturbed_median = at(undisturbed, 500);
  t.undisturbed_p99 = at(undisturbed, 990);
  t.undisturbed_over_slow = share_over_slow(undisturbed);
  for (size_t s = 0; s < c.step_us.size() && s < c.step_ops_us.size(); ++s) {
    if (c.step_us[s] < t.p99) continue;
    ++t.slow_steps;
    for (size_t op = 0; op < kOpEvictAhead; ++op) t.slow_ops_us[op] += c.step_ops_us[s][op];
    if (s < c.step_evictions.size()) t.slow_evictions += c.step_evictions[s];
  }
  std::vector<double> evict, ahead, after;
  for (const auto& ops : c.step_ops_us) {
    evict.push_back(ops[kOpEvictAhead]);
    after.push_back(ops[kOpCommitAfter] + ops[kOpFreeAfter] + ops[kOpAdjustAfter]);
    double all = 0;
    for (size_t op = kOpEvictAhead; op < kSimOps; ++op) all += ops[op];
    ahead.push_back(all);
    t.evict_total += ops[kOpEvictAhead];
    t.admit_total += ops[kOpAdmitAhead];
    t.touch_total += ops[kOpTouch];
    t.schedule_total += ops[kOpScheduleAhead];
    t.after_total += after.back();
  }
  t.evict_p99 = percentile(evict, 990);
  t.ahead_p99 = percentile(ahead, 990);
  t.after_p99 = percentile(after, 990);
  return t;
}

// step,total_us,<one column per call>,evicted_pages,descheduled (sim_step_times.h).
bool write_step_times(const std::string& path, const SimCounters& c) {
  std::ofstream out(path);
  out << "step,total_us";
  for (const char* key : kSimOpKeys) out << ',' << key;
  out << ",evicted_pages,descheduled\n";
  for (size_t s = 0; s < c.step_us.size() && s < c.step_ops_us.size(); ++s) {
    out << s << ',' << c.step_us[s];
    for (float us : c.step_ops_us[s]) out << ',' << us;
    out << ',' << (s < c.step_evictions.size() ? c.step_evictions[s] : 0);
    out << ',' << (s < c.step_descheduled.size() && c.step_descheduled[s] ? 1 : 0) << '\n';
  }
  return static_cast<bool>(out);
}

// "where the slowest 1 % of steps spend it: resize 61 %, add_request 30 %, ..." (largest first).
std::string slow_step_profile(const StepTimes& t) {
  double total = 0;
  for (double us : t.slow_ops_us) total += us;
  if (t.slow_steps == 0 || total <= 0) return "";
  std::vector<size_t> order(kSimOps);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return t.slow_ops_us[a] > t.slow_ops_us[b]; });
  std::string out;
  char buf[128];
  for (size_t op : order) {
    if (t.slow_ops_us[op] < 0.005 * total) break;
    std::snprintf(buf, sizeof buf, "%s%s %.0f %%", out.empty() ? "" : ", ", kSimOpNames[op],
                  100 * t.slow_ops_us[op] / total);
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                " (%llu steps, %.0f us each on average, evicting %.1f pages in the step)",
                static_cast<unsigned long long>(t.slow_steps), total / t.slow_steps,
                static_cast<double>(t.slow_evictions) / t.slow_steps);
  return out + buf;
}

}  // namespace hybridkv::tools
