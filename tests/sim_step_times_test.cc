// `hybridkv sim --step-times`: every step's manager CPU time by call, and the report's summary
// of the step times (the profile behind issue 35's bound on the worst step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {

using hybridkv::testing::CliRun;
using hybridkv::testing::run_cli;
using hybridkv::testing::scratch;
using hybridkv::testing::slurp;

#ifdef HKV_SANITIZED
constexpr const char* kVerifyLimit = "20";  // the sanitized CLI is ~10x slower
#else
constexpr const char* kVerifyLimit = "60";
#endif

const std::string kSlice = std::string(HKV_DATA_DIR) + "/mooncake_conversation_first1000.jsonl";
const std::string kModel = std::string(HKV_MODELS_DIR) + "/nemotron_h_8b.json";

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

// A --step-times column of work done while the GPU computes (ahead of the next step, or after
// the step's launch with --after-launch).
bool while_the_gpu_computes(const std::string& column) {
  return column.find("_ahead") != std::string::npos ||
         column.find("_after_launch") != std::string::npos;
}

// A --step-times column, step by step.
std::vector<double> column(const std::vector<std::string>& lines, const std::string& name) {
  const std::vector<std::string> header = split(lines.at(0), ',');
  const auto at = std::find(header.begin(), header.end(), name);
  EXPECT_NE(at, header.end()) << name;
  std::vector<double> out;
  if (at == header.end()) return out;
  for (size_t i = 1; i < lines.size(); ++i)
    out.push_back(std::stod(split(lines[i], ',').at(static_cast<size_t>(at - header.begin()))));
  return out;
}

// The sum of a --step-times column over every step.
double column_sum(const std::vector<std::string>& lines, const std::string& name) {
  const std::vector<double> us = column(lines, name);
  return std::accumulate(us.begin(), us.end(), 0.0);
}

TEST(SimStepTimes, OneRowPerStepWhoseCallsAddUpToItsTotal) {
  const std::string csv = scratch("steps.csv"), json = scratch("steps.json");
  const CliRun r =
      run_cli("sim --model " + kModel + " --trace " + kSlice +
              " --limit 60 --max-batch 16 --gpu-quota 8GiB --host-quota 16GiB --quiet --json " +
              json + " --step-times " + csv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("of steps over 100 us"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  const std::vector<std::string> lines = split(slurp(csv), '\n');
  ASSERT_EQ(lines.size(), j["steps"].get<uint64_t>() + 1);  // the header, then every step
  const std::vector<std::string> header = split(lines[0], ',');
  ASSERT_GE(header.size(), 3u);
  EXPECT_EQ(header[0], "step");
  EXPECT_EQ(header[1], "total_us");
  EXPECT_EQ(header[6], "commit");
  EXPECT_EQ(header[7], "resize");
  EXPECT_EQ(header[9], "can_resume");  // the check before every resume is the step's CPU too
  EXPECT_EQ(header.back(), "descheduled");
  double max = 0;
  std::vector<double> undisturbed;  // the steps the OS did not take the core in
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> cells = split(lines[i], ',');
    ASSERT_EQ(cells.size(), header.size()) << "row " << i;
    EXPECT_EQ(std::stoull(cells[0]), i - 1);
    const double total = std::stod(cells[1]);
    double calls = 0;  // calls while the GPU computes are not in the step's total
    for (size_t c = 2; c + 2 < cells.size(); ++c)
      if (!while_the_gpu_computes(header[c])) calls += std::stod(cells[c]);
    EXPECT_NEAR(calls, total, 1e-3 * total + 0.01) << "row " << i;  // float columns
    max = std::max(max, total);
    ASSERT_TRUE(cells.back() == "0" || cells.back() == "1") << "row " << i << ": " << cells.back();
    if (cells.back() == "0") undisturbed.push_back(total);
  }
  // The figures without the descheduled steps are those of the other rows.
  ASSERT_FALSE(undisturbed.empty());
  EXPECT_EQ(j["steps_descheduled"].get<uint64_t>(), lines.size() - 1 - undisturbed.size());
  std::sort(undisturbed.begin(), undisturbed.end());
  const auto at = [&](size_t per_mille) {
    return undisturbed[std::min(undisturbed.size() - 1, undisturbed.size() * per_mille / 1000)];
  };
  const double median = j["manager_us_per_step_median_undisturbed"];
  const double p99_kept = j["manager_us_per_step_p99_undisturbed"];
  EXPECT_NEAR(median, at(500), 1e-5 * median + 1e-3);
  EXPECT_NEAR(p99_kept, at(990), 1e-5 * p99_kept + 1e-3);
  EXPECT_NEAR(j["manager_us_per_step_max"].get<double>(), max, 1e-5 * max);  // 6 digits in the CSV
  const double p90 = j["manager_us_per_step_p90"], p99 = j["manager_us_per_step_p99"];
  EXPECT_LE(j["manager_us_per_step_median"].get<double>(), p90);
  EXPECT_LE(p90, p99);
  EXPECT_LE(p99, max);
  const double share = j["steps_over_100us_share"];
  EXPECT_GE(share, 0.0);
  EXPECT_LE(share, 1.0);
  std::remove(csv.c_str());
  std::remove(json.c_str());
}

// Room freed ahead of every step on the host backend, every page checked by the fake engine.
TEST(SimStepTimes, EvictingAheadKeepsEveryPageIntactAndIsTimedApart) {
  const std::string csv = scratch("ahead.csv"), json = scratch("ahead.json");
  const CliRun r = run_cli("sim --model " + kModel + " --trace " + kSlice + " --limit " +
                           std::string(kVerifyLimit) +
                           " --backend host --tp 8 --gpu-quota 512MiB "
                           "--host-quota 1GiB --max-batch 16 --verify --quiet --evict-ahead 4096 "
                           "--json " +
                           json + " --step-times " + csv);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("evict ahead"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
  EXPECT_GT(j["bytes_offloaded"].get<uint64_t>(), 0u);
  EXPECT_GT(j["evict_ahead_seconds"].get<double>(), 0.0);
  const std::vector<std::string> lines = split(slurp(csv), '\n');
  ASSERT_GT(lines.size(), 1u);
  const std::vector<std::string> header = split(lines[0], ',');
  ASSERT_GE(header.size(), 3u);
  for (const char* column : {"evict_ahead", "admit_ahead", "touch_ahead"})
    EXPECT_NE(std::find(header.begin(), header.end(), column), header.end()) << column;
  ASSERT_EQ(header.at(header.size() - 2), "evicted_pages");
  // The column before the last counts the pages the step's own calls evicted, not those evicted
  // ahead: the same run without evicting ahead evicts more inside its steps.
  auto in_steps = [&](const std::string& path) {
    uint64_t pages = 0;
    const std::vector<std::string> rows = split(slurp(path), '\n');
    for (size_t i = 1; i < rows.size(); ++i) {
      const std::vector<std::string> cells = split(rows[i], ',');
      pages += std::stoull(cells.at(cells.size() - 2));
    }
    return pages;
  };
  const uint64_t ahead = in_steps(csv);
  const CliRun plain = run_cli("sim --model " + kModel + " --trace " + kSlice + " --limit " +
                               std::string(kVerifyLimit) +
                               " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB "
                               "--max-batch 16 --quiet --step-times " +
                               csv);
  ASSERT_EQ(plain.exit_code, 0) << plain.err << plain.out;
  const uint64_t without = in_steps(csv);
  EXPECT_GT(without, 0u);
  EXPECT_LT(ahead, without);
  EXPECT_LE(j["slowest_steps_evicted_pages"].get<uint64_t>(), ahead);
  std::remove(csv.c_str());
  std::remove(json.c_str());
}

// Suspended and next-admitted requests' away pages onboarded ahead of their resumes, in parts,
// on the host backend: every page checked by the fake engine, and the resumes find them up.
TEST(SimStepTimes, AdmittingAheadKeepsEveryPageIntactAndIsTimedApart) {
  const std::string json = scratch("admit.json");
  const std::string common = "sim --model " + kModel + " --trace " + kSlice + " --limit " +
                             std::string(kVerifyLimit) +
                             " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB "
                             "--max-batch 16 --verify --quiet --json " +
                             json;
  const CliRun r = run_cli(common + " --evict-ahead 4096 --admit-ahead 64");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("admit ahead"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
  EXPECT_GT(j["pages_prefetched"].get<uint64_t>(), 0u);
  EXPECT_GT(j["admit_ahead_seconds"].get<double>(), 0.0);
  // All the work ahead includes evicting ahead, step by step.
  EXPECT_GE(j["ahead_us_per_step_p99"].get<double>(),
            j["evict_ahead_us_per_step_p99"].get<double>());
  std::remove(json.c_str());
}

// Several next admissions created ahead (--create-ahead), on the host backend: every page
// checked by the fake engine; more than one waits created at once; the option needs
// --admit-ahead. At 256 MiB of GPU the queue backs up at both limits (the sanitized 20
// requests as the release build's 60; at 512 MiB the sanitized run never created two).
TEST(SimStepTimes, CreatingSeveralAdmissionsAheadKeepsEveryPageIntact) {
  const std::string json = scratch("create.json");
  const std::string common = "sim --model " + kModel + " --trace " + kSlice + " --limit " +
                             std::string(kVerifyLimit) +
                             " --backend host --tp 8 --gpu-quota 256MiB --host-quota 1GiB "
                             "--max-batch 16 --verify --quiet --json " +
                             json;
  const CliRun r = run_cli(common + " --evict-ahead 4096 --admit-ahead 64 --create-ahead 8");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
  EXPECT_GT(j["requests_created_ahead"].get<uint64_t>(), 0u);
  EXPECT_GT(j["most_created_ahead"].get<uint64_t>(), 1u);
  EXPECT_LE(j["most_created_ahead"].get<uint64_t>(), 8u);
  const CliRun alone = run_cli(common + " --create-ahead 4");
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.err.find("--create-ahead: 4 needs --admit-ahead"), std::string::npos)
      << alone.err;
  std::remove(json.c_str());
}

// The prefixes of the next waiting requests moved to the back of the eviction order ahead of
// each step (KvCacheManager::touch_reuse), on the host backend: every page checked by the fake
// engine, the time reported apart from the steps, and 0 turns it off.
TEST(SimStepTimes, TouchingQueuedPrefixesKeepsEveryPageIntactAndIsTimedApart) {
  const std::string json = scratch("touch.json");
  const std::string common = "sim --model " + kModel + " --trace " + kSlice + " --limit " +
                             std::string(kVerifyLimit) +
                             " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB "
                             "--max-batch 16 --verify --quiet --admission budget --json " +
                             json;
  for (const char* n : {"32", "0"}) {
    const CliRun r = run_cli(common + " --touch-queued " + n);
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    const nlohmann::json j = nlohmann::json::parse(slurp(json));
    EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
    EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
    EXPECT_GT(j["reused_tokens"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["settings"]["touch_queued"].get<uint64_t>(), std::stoull(n));
    if (std::string(n) == "0") {
      EXPECT_EQ(r.out.find("touch queued"), std::string::npos) << r.out;
      EXPECT_EQ(j["touch_queued_seconds"].get<double>(), 0.0);
    } else {
      EXPECT_NE(r.out.find("touch queued"), std::string::npos) << r.out;
      EXPECT_GT(j["touch_queued_seconds"].get<double>(), 0.0);
    }
  }
  std::remove(json.c_str());
}

// --after-launch: the step's commits, the frees of the requests the step before finished and
// the rebalancing run after the step's launch, on the host backend with every page checked by
// the fake engine, under both admissions; they are timed apart from the step.
TEST(SimStepTimes, AfterTheLaunchKeepsEveryPageIntactAndIsTimedApart) {
  const std::string csv = scratch("after.csv"), json = scratch("after.json");
  for (const char* admission : {"eager", "budget"}) {
    SCOPED_TRACE(admission);
    const CliRun r = run_cli(
        "sim --model " + kModel + " --trace " + kSlice + " --limit " + std::string(kVerifyLimit) +
        " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB --max-batch 16 "
        "--verify --quiet --evict-ahead 4096 --after-launch --admission " +
        admission + " --json " + json + " --step-times " + csv);
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    EXPECT_NE(r.out.find("after the launch"), std::string::npos) << r.out;
    const nlohmann::json j = nlohmann::json::parse(slurp(json));
    EXPECT_TRUE(j["settings"]["after_launch"].get<bool>());
    EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
    EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
    EXPECT_GT(j["reused_tokens"].get<uint64_t>(), 0u);  // what was committed after was matched
    EXPECT_GT(j["after_launch_seconds"].get<double>(), 0.0);
    EXPECT_GE(j["ahead_us_per_step_p99"].get<double>(),
              j["after_launch_us_per_step_p99"].get<double>());
    const std::vector<std::string> lines = split(slurp(csv), '\n');
    ASSERT_GT(lines.size(), 1u);
    // None of it inside a step; all of it after the launches ("free" inside a step is only
    // a request preempted for recompute).
    EXPECT_EQ(column_sum(lines, "commit"), 0.0);
    EXPECT_EQ(column_sum(lines, "rebalance"), 0.0);
    EXPECT_GT(column_sum(lines, "commit_after_launch"), 0.0);
    EXPECT_GT(column_sum(lines, "free_after_launch"), 0.0);
  }
  std::remove(csv.c_str());
  std::remove(json.c_str());
}

// --schedule-ahead: the next step's resumptions and admissions are made while the GPU computes
// the step before, on the host backend with every page checked by the fake engine, at 256 MiB
// of GPU where requests wait for room and are preempted. They are the decisions the step's start
// would have made: every count of the run is the same as without it. With every request there
// from the start (--arrival asap) no step after the first resumes or admits inside itself; the
// same run without it does. It needs eager admission.
TEST(SimStepTimes, SchedulingAheadMakesTheSameRunTimedApart) {
  const std::string csv = scratch("sched.csv"), json = scratch("sched.json");
  const std::string common = "sim --model " + kModel + " --trace " + kSlice + " --limit " +
                             std::string(kVerifyLimit) +
                             " --backend host --tp 8 --gpu-quota 256MiB --host-quota 1GiB "
                             "--max-batch 16 --verify --quiet --evict-ahead 4096 --after-launch "
                             "--admit-ahead 64 --json " +
                             json + " --step-times " + csv;
  struct Run {
    nlohmann::json report;
    std::vector<std::string> steps;
  };
  const auto run = [&](const std::string& extra) {
    const CliRun r = run_cli(common + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
    return Run{nlohmann::json::parse(slurp(json)), split(slurp(csv), '\n')};
  };
  const Run ahead = run(" --schedule-ahead");
  const Run plain = run("");
  EXPECT_TRUE(ahead.report["settings"]["schedule_ahead"].get<bool>());
  EXPECT_EQ(ahead.report["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(ahead.report["verify_pages_checked"].get<uint64_t>(), 1000u);
  EXPECT_GT(ahead.report["failed_admissions"].get<uint64_t>(), 0u);  // the next start's waits
  EXPECT_GT(ahead.report["suspends"].get<uint64_t>() + ahead.report["recomputes"].get<uint64_t>(),
            0u);
  for (const char* count :
       {"steps", "reused_tokens", "suspends", "resumes", "recomputes", "failed_admissions",
        "most_joins_in_a_step", "idle_joins", "bytes_offloaded", "bytes_onboarded", "pages_dropped",
        "pages_prefetched", "requests_created_ahead", "ssm_snapshot_hits", "verify_pages_checked"})
    EXPECT_EQ(ahead.report[count], plain.report[count]) << count;
  EXPECT_GT(ahead.report["schedule_ahead_seconds"].get<double>(), 0.0);
  EXPECT_EQ(plain.report["schedule_ahead_seconds"].get<double>(), 0.0);
  const auto admits_inside_a_later_step = [](const std::vector<std::string>& steps) {
    bool any = false;
    for (const char* call : {"add_request", "resume", "can_resume"}) {
      const std::vector<double> us = column(steps, call);
      any = any || std::any_of(us.begin() + std::min<size_t>(1, us.size()), us.end(),
                               [](double v) { return v > 0; });
    }
    return any;
  };
  EXPECT_FALSE(admits_inside_a_later_step(ahead.steps));
  EXPECT_TRUE(admits_inside_a_later_step(plain.steps));
  EXPECT_GT(column_sum(ahead.steps, "schedule_ahead"), 0.0);
  const CliRun budget = run_cli(common + " --schedule-ahead --admission budget");
  EXPECT_NE(budget.exit_code, 0);
  EXPECT_NE(budget.err.find("--schedule-ahead: needs --admission eager"), std::string::npos)
      << budget.err;
  std::remove(csv.c_str());
  std::remove(json.c_str());
}

// --onboard-in-step: a resumption or admission with more pages away waits while they come up
// between steps (--admit-ahead, in parts), on the host backend with every page checked by the
// fake engine; without --admit-ahead nothing would bring them up: refused before the run.
TEST(SimStepTimes, OnboardingBetweenStepsKeepsEveryPageIntact) {
  const std::string json = scratch("onboard.json");
  const std::string common = "sim --model " + kModel + " --trace " + kSlice + " --limit " +
                             std::string(kVerifyLimit) +
                             " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB "
                             "--max-batch 16 --quiet --admission budget --onboard-in-step 2 ";
  const CliRun r = run_cli(common + "--verify --evict-ahead 4096 --admit-ahead 8 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("waited a step while its pages came up"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
  EXPECT_GT(j["onboard_waits"].get<uint64_t>(), 0u);
  EXPECT_GT(j["pages_prefetched"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["settings"]["onboard_in_step"].get<uint64_t>(), 2u);
  const CliRun refused = run_cli(common);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--onboard-in-step: 2 needs --admit-ahead"), std::string::npos)
      << refused.err;
  std::remove(json.c_str());
}

TEST(SimStepTimes, AnUnwritablePathIsRefusedBeforeTheRun) {
  const CliRun r = run_cli("sim --model " + kModel + " --trace " + kSlice +
                           " --limit 5 --quiet --step-times /nonexistent-dir/steps.csv");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--step-times"), std::string::npos) << r.err;
}

}  // namespace
