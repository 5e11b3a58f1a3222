// `hybridkv sim`: the reuse bound on the bundled slice, verification through the fake engine,
// bad traces reported with their line, and the report files.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include "test_backend.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {

using hybridkv::testing::CliRun;
using hybridkv::testing::run_cli;
using hybridkv::testing::scratch;
using hybridkv::testing::slurp;

#ifdef HKV_SANITIZED
constexpr int kVerifyLimit = 30;                          // the sanitized CLI is ~10x slower
constexpr const char* kPipelineTrace = "synthetic:40:3";  // 100 requests took 94 s sanitized
constexpr int kAdmissionLimit = 20;  // two verified runs of 30 took 74 s sanitized
#else
constexpr int kVerifyLimit = 120;
constexpr const char* kPipelineTrace = "synthetic:100:3";
constexpr int kAdmissionLimit = 48;
#endif

const std::string kSlice = std::string(HKV_DATA_DIR) + "/mooncake_conversation_first1000.jsonl";
const std::string kModel = std::string(HKV_MODELS_DIR) + "/nemotron_h_8b.json";

// The bound computed independently: for every request, the longest prefix of whole 512-token
// id blocks (and the shorter tail of an equal id) shared with any earlier prompt, pairwise.
uint64_t brute_force_bound(const std::string& path = kSlice) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::pair<uint64_t, std::vector<uint64_t>>> earlier;
  uint64_t bound = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const uint64_t len = j["input_length"];
    const std::vector<uint64_t> ids = j["hash_ids"];
    uint64_t best = 0;
    for (const auto& [other_len, other] : earlier) {
      uint64_t common = 0;
      for (size_t b = 0; b < ids.size() && b < other.size() && ids[b] == other[b]; ++b) {
        const uint64_t mine = std::min<uint64_t>(512, len - b * 512);
        const uint64_t theirs = std::min<uint64_t>(512, other_len - b * 512);
        common += std::min(mine, theirs);
        if (std::min(mine, theirs) < 512) break;
      }
      best = std::max(best, common);
    }
    bound += std::min(best, len - 1);
    earlier.push_back({len, ids});
  }
  return bound;
}

TEST(Sim, AttentionOnlyOneAtATimeReusesExactlyTheBound) {
  const std::string json = scratch("bound.json");
  const CliRun r = run_cli(
      "sim --model " + kModel + " --trace " + kSlice +
      " --attention-only --max-batch 1 --backend none --gpu-quota 8TiB --quiet --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  const uint64_t independent = brute_force_bound();
  EXPECT_EQ(independent, 2962765u);  // the figure in the shared trace notes
  EXPECT_EQ(j["reuse_bound_tokens"].get<uint64_t>(), independent);
  EXPECT_EQ(j["reused_tokens"].get<uint64_t>(), independent);
  EXPECT_EQ(j["prompt_tokens"].get<uint64_t>(), 13732944u);
  std::remove(json.c_str());
}

// Pages cascade to a DISK tier (small host tier) and come back: every byte checked.
TEST(Sim, VerifyWithADiskTierFindsNoMismatch) {
  const std::string json = scratch("verify-disk.json");
  hybridkv::testing::TempDir dir;
  const CliRun r = run_cli("sim --model " + kModel + " --trace " + kSlice + " --limit " +
                           std::to_string(kVerifyLimit) +
                           " --backend host --tp 8 --gpu-quota 512MiB --host-quota 64MiB "
                           "--disk-quota 2GiB --disk-path " +
                           dir.path +
                           " --max-batch 16 --verify --quiet --host-link-gbps 10,20 "
                           "--disk-link-gbps 1,2 --json " +
                           json);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
  EXPECT_GT(j["bytes_offloaded"].get<uint64_t>(), 0u);
  // Tier moves: each colder tier's share adds up to the totals; bus time at the given rates.
  const nlohmann::json& tiers = j["tier_moves"];
  ASSERT_EQ(tiers.size(), 2u);
  EXPECT_EQ(tiers[0]["tier"], "HOST");
  EXPECT_EQ(tiers[1]["tier"], "DISK");
  uint64_t ran = 0, up = 0;
  for (size_t t = 0; t < 2; ++t) {
    const auto down = tiers[t]["offloaded_bytes"].get<uint64_t>();
    const auto cancelled = tiers[t]["offload_cancelled_bytes"].get<uint64_t>();
    const auto onboarded = tiers[t]["onboarded_bytes"].get<uint64_t>();
    EXPECT_GT(down, 0u) << t;
    ran += down - cancelled;
    up += onboarded;
    const double rate = t == 0 ? 1e10 : 1e9;  // down; up is twice as fast
    EXPECT_NEAR(tiers[t]["bus_seconds"].get<double>(),
                static_cast<double>(down - cancelled) / rate + onboarded / (2 * rate), 1e-9)
        << t;
  }
  EXPECT_EQ(ran, j["bytes_offloaded"].get<uint64_t>());
  EXPECT_EQ(up, j["bytes_onboarded"].get<uint64_t>());
  EXPECT_GT(tiers[1]["onboarded_bytes"].get<uint64_t>(), 0u);  // pages came back from disk
  // ... and evicted again, went back to the bytes the disk kept (kept copies, checked by verify)
  EXPECT_GT(tiers[1]["returned_to_copy_bytes"].get<uint64_t>(), 0u);
  std::remove(json.c_str());
}

TEST(Sim, VerifyOnTheHostBackendFindsNoMismatch) {
  const std::string json = scratch("verify.json"), svg = scratch("plot.svg");
  const CliRun r = run_cli(
      "sim --model " + kModel + " --trace " + kSlice + " --limit " + std::to_string(kVerifyLimit) +
      " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB "
      "--max-batch 16 --snapshot-policy branch,demand,periodic:2048 --verify --quiet "
      "--json " +
      json + " --svg " + svg);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u);
  EXPECT_GT(j["reused_tokens"].get<uint64_t>(), 0u);
  EXPECT_GT(j["bytes_offloaded"].get<uint64_t>(), 0u);  // the host tier was used
  EXPECT_NE(slurp(svg).find("<svg"), std::string::npos);
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

// --admission budget (vLLM v1's order): requests join after the running ones, only while the
// step has tokens left, and compute in the step they join; every page still checks. Eager
// admission on the same settings joins requests that wait a step (the counter can fail).
TEST(Sim, BudgetAdmissionJoinsOnlyRequestsThatComputeInTheirStep) {
  std::map<std::string, nlohmann::json> runs;
  for (const std::string admission : {"eager", "budget"}) {
    const std::string json = scratch("admission-" + admission + ".json");
    const CliRun r = run_cli("sim --model " + kModel + " --trace " + kSlice + " --limit " +
                             std::to_string(kAdmissionLimit) +
                             " --backend host --tp 8 --gpu-quota 512MiB --host-quota 1GiB "
                             "--max-batch 16 --verify --quiet --admission " +
                             admission + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << admission << r.err << r.out;
    runs[admission] = nlohmann::json::parse(slurp(json));
    std::remove(json.c_str());
    const nlohmann::json& j = runs[admission];
    EXPECT_EQ(j["settings"]["admission"], admission);
    EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u) << admission;
    EXPECT_GT(j["verify_pages_checked"].get<uint64_t>(), 1000u) << admission;
    EXPECT_EQ(j["requests"].get<uint64_t>(), static_cast<uint64_t>(kAdmissionLimit));
  }
  const nlohmann::json &eager = runs["eager"], &budget = runs["budget"];
  EXPECT_GT(eager["idle_joins"].get<uint64_t>(), 0u);
  EXPECT_EQ(eager["most_joins_in_a_step"].get<uint64_t>(), 16u);  // the whole batch at step 0
  EXPECT_EQ(budget["idle_joins"].get<uint64_t>(), 0u);
  EXPECT_LT(budget["most_joins_in_a_step"].get<uint64_t>(),
            eager["most_joins_in_a_step"].get<uint64_t>());
  EXPECT_GT(budget["reused_tokens"].get<uint64_t>(), 0u);
}

// Kept copies: pages that came up from the host and are evicted again go back to the bytes the
// host kept (no transfer), and every byte still checks; with --colder-copies drop none are kept.
TEST(Sim, KeptHostCopiesTakeEvictionsWithoutATransferAndVerify) {
  const std::string json = scratch("copies.json");
  for (const std::string copies : {"keep", "drop"}) {
    const CliRun r = run_cli("sim --model " + kModel + " --trace " + kSlice + " --limit " +
                             std::to_string(kVerifyLimit) +
                             " --backend host --tp 8 --gpu-quota 256MiB --host-quota 2GiB "
                             "--max-batch 16 --verify --quiet --colder-copies " +
                             copies + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    const nlohmann::json j = nlohmann::json::parse(slurp(json));
    EXPECT_EQ(j["verify_mismatches"].get<uint64_t>(), 0u) << copies;
    EXPECT_GT(j["bytes_onboarded"].get<uint64_t>(), 0u) << copies;
    const auto returned = j["tier_moves"][0]["returned_to_copy_bytes"].get<uint64_t>();
    const auto kept = j["bytes_copies_kept"].get<uint64_t>();
    EXPECT_EQ(j["settings"]["colder_copies"], copies);
    if (copies == "keep") {
      EXPECT_GT(returned, 0u);
      EXPECT_GE(kept, returned);
    } else {
      EXPECT_EQ(returned, 0u);
      EXPECT_EQ(kept, 0u);
    }
  }
  std::remove(json.c_str());
}

// One request at a time, attention only, memory for everything: every request reuses exactly
// its longest prefix shared with an earlier prompt, computed here from the written trace.
TEST(Sim, SyntheticTrafficReusesItsIndependentlyComputedBound) {
  const std::string trace = scratch("synthetic_300_7.jsonl");
  const std::string json = scratch("synthetic_300_7.json");
  const CliRun r = run_cli("sim --model " + kModel +
                           " --trace synthetic:300:7 --backend none --attention-only "
                           "--max-batch 1 --gpu-quota 400GiB --quiet --write-trace " +
                           trace + " --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  const uint64_t expected = brute_force_bound(trace);
  EXPECT_GT(expected, 0u);
  EXPECT_EQ(j["requests"].get<uint64_t>(), 300u);
  EXPECT_EQ(j["reused_tokens"].get<uint64_t>(), expected);
  for (const char* field : {"300 requests", "reused tokens", "preemptions"})
    EXPECT_NE(r.out.find(field), std::string::npos) << field << "\n" << r.out;
  std::remove(json.c_str());
  std::remove(trace.c_str());
}

// The named shapes of traffic (issue 35 item 2): each is what it says (prompts that extend
// earlier ones; shared prefixes; the same blocks in different orders or at different offsets),
// arrives in time order, and with one request at a time and memory for everything the
// attention-only model reuses exactly its independently computed bound.
std::vector<std::vector<uint64_t>> trace_ids(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::vector<uint64_t>> out;
  uint64_t last = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_GE(j["timestamp"].get<uint64_t>(), last);
    last = j["timestamp"].get<uint64_t>();
    out.push_back(j["hash_ids"].get<std::vector<uint64_t>>());
  }
  return out;
}

// Whether some prompt extends an earlier one (its ids but the last, then more).
bool extends_an_earlier_prompt(const std::vector<std::vector<uint64_t>>& ids) {
  for (size_t j = 0; j < ids.size(); ++j) {
    for (size_t i = 0; i < j; ++i) {
      const size_t n = ids[i].size() - 1;
      if (n >= 2 && ids[j].size() > ids[i].size() &&
          std::equal(ids[i].begin(), ids[i].begin() + n, ids[j].begin()))
        return true;
    }
  }
  return false;
}

// Whether some block id stands at two different positions in two prompts.
bool a_block_moves(const std::vector<std::vector<uint64_t>>& ids) {
  std::map<uint64_t, size_t> at;
  for (const auto& prompt : ids) {
    for (size_t p = 0; p < prompt.size(); ++p) {
      auto [it, fresh] = at.emplace(prompt[p], p);
      if (!fresh && it->second != p) return true;
    }
  }
  return false;
}

TEST(Sim, EveryNamedShapeOfTrafficHasItsShapeAndReusesItsBound) {
  for (const std::string shape : {"chat", "system", "agent", "fewshot", "rag"}) {
    SCOPED_TRACE(shape);
    const std::string trace = scratch("shape_" + shape + ".jsonl");
    const std::string json = scratch("shape_" + shape + ".json");
    const CliRun r = run_cli("sim --model " + kModel + " --trace synthetic:" + shape +
                             ":200:3 --backend none --attention-only --max-batch 1 "
                             "--gpu-quota 400GiB --quiet --write-trace " +
                             trace + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<std::vector<uint64_t>> ids = trace_ids(trace);
    ASSERT_EQ(ids.size(), 200u);
    std::map<uint64_t, uint32_t> first_block;
    for (const auto& prompt : ids) ++first_block[prompt.front()];
    uint32_t most_shared = 0;
    for (const auto& [id, n] : first_block) most_shared = std::max(most_shared, n);
    if (shape == "chat" || shape == "agent") {
      EXPECT_TRUE(extends_an_earlier_prompt(ids));
    }
    if (shape == "system" || shape == "fewshot" || shape == "rag") {
      EXPECT_GE(most_shared, 20u);
    }
    if (shape == "fewshot" || shape == "rag") {
      EXPECT_TRUE(a_block_moves(ids));
    }
    if (shape == "chat") {
      EXPECT_FALSE(a_block_moves(ids));
    }
    const nlohmann::json j = nlohmann::json::parse(slurp(json));
    const uint64_t expected = brute_force_bound(trace);
    EXPECT_GT(expected, 0u);
    EXPECT_EQ(j["reused_tokens"].get<uint64_t>(), expected);
    // The same seed gives the same trace; another seed another.
    const std::string again = scratch("shape_again.jsonl");
    for (const char* seed : {"3", "4"}) {
      ASSERT_EQ(run_cli("sim --model " + kModel + " --trace synthetic:" + shape + ":200:" + seed +
                        " --backend none --quiet --limit 20 --write-trace " + again)
                    .exit_code,
                0);
      const auto head = trace_ids(again);
      EXPECT_EQ(head == std::vector<std::vector<uint64_t>>(ids.begin(), ids.begin() + 20),
                std::string(seed) == "3");
    }
    std::remove(again.c_str());
    std::remove(json.c_str());
    std::remove(trace.c_str());
  }
  for (const auto& [spec, message] :
       {std::pair{"synthetic:bogus:5",
                  "unknown shape 'bogus' (chat, system, agent, fewshot or rag)"},
        std::pair{"synthetic:chat:0", "N must be in [1, 1000000]"},
        std::pair{"synthetic:rag:5x", "--trace synthetic:rag:5x: '5x'"}}) {
    const CliRun r = run_cli("sim --model " + kModel + " --trace " + spec + " --quiet");
    EXPECT_EQ(r.exit_code, 2) << spec;
    EXPECT_NE(r.err.find(message), std::string::npos) << spec << "\n" << r.err;
  }
}

// A pipeline rank (issue 34 item 4) holds only its layers: with the same quota it reuses at
// least what the whole model does, its report names the layout, and the verified run on the
// host backend finds every page intact.
TEST(Sim, APipelineRankSimulatesItsOwnLayers) {
  const std::string whole_json = scratch("pp_whole.json"), rank_json = scratch("pp_rank1.json");
  const std::string common =
      "sim --model " + kModel + " --trace " + kPipelineTrace + " --backend host " +
      "--verify --max-batch 4 --gpu-quota 1GiB --host-quota 2GiB --quiet --json ";
  const CliRun whole = run_cli(common + whole_json);
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const CliRun rank = run_cli(common + rank_json + " --pp 2 --pp-rank 1");
  ASSERT_EQ(rank.exit_code, 0) << rank.err;
  const nlohmann::json w = nlohmann::json::parse(slurp(whole_json));
  const nlohmann::json r = nlohmann::json::parse(slurp(rank_json));
  EXPECT_EQ(r["settings"]["pp"].get<uint32_t>(), 2u);
  EXPECT_EQ(r["settings"]["pp_rank"].get<uint32_t>(), 1u);
  EXPECT_EQ(r["verify_mismatches"].get<uint64_t>(), 0u);
  EXPECT_GT(r["verify_pages_checked"].get<uint64_t>(), 0u);
  EXPECT_GE(r["reused_tokens"].get<uint64_t>(), w["reused_tokens"].get<uint64_t>());
  std::remove(whole_json.c_str());
  std::remove(rank_json.c_str());
}

TEST(Sim, BadTracesNameTheLineAndStopCleanly) {
  const std::map<std::string, std::string> cases = {
      {"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2}\n",
       "line 1: field 'hash_ids' is missing"},
      {"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": [1]}\nnot "
       "json\n",
       "line 2: not a JSON object"},
      {"{\"timestamp\": 0, \"input_length\": -5, \"output_length\": 2, \"hash_ids\": [1]}\n",
       "line 1: field 'input_length' is -5"},
      {"{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1]}\n",
       "line 1: field 'input_length' is missing"},
      {"\n{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": [\"x\"]}\n",
       "line 2: hash_ids holds \"x\""},
  };
  for (const auto& [text, expected] : cases) {
    SCOPED_TRACE(expected);
    const std::string path = scratch("bad.jsonl");
    std::ofstream(path) << text;
    const CliRun r =
        run_cli("sim --model " + kModel + " --trace " + path + " --backend none --quiet");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(expected), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line";
    std::remove(path.c_str());
  }
  const CliRun missing = run_cli("sim --model " + kModel + " --trace /nonexistent.jsonl --quiet");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot open the trace"), std::string::npos);
  const CliRun policy =
      run_cli("sim --model " + kModel + " --trace " + kSlice + " --snapshot-policy sometimes");
  EXPECT_EQ(policy.exit_code, 2);
  EXPECT_NE(policy.err.find("--snapshot-policy: 'sometimes'"), std::string::npos);
}

void expect_sim_refuses(const std::string& args, const std::string& message) {
  const CliRun r = run_cli("sim --model " + kModel + " --trace " + kSlice + " --limit 5 " + args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
  EXPECT_EQ(r.out, "") << "nothing ran: " << args;
}

// Mistakes that would only show at the end of a long run are reported before it starts.
TEST(Sim, BadSettingsAreRefusedBeforeAnyWork) {
  expect_sim_refuses("--json /nonexistent-dir/report.json",
                     "--json: cannot write '/nonexistent-dir/report.json'");
  expect_sim_refuses("--svg /nonexistent-dir/plot.svg", "--svg: cannot write");
  expect_sim_refuses("--json /tmp", "--json: '/tmp' is a directory");
  expect_sim_refuses("--disk-quota 1GiB", "--disk-quota needs --disk-path");
  expect_sim_refuses("--disk-quota 1GiB --disk-path /nonexistent-dir",
                     "--disk-path: '/nonexistent-dir' is not an existing directory");
  expect_sim_refuses("--disk-path /tmp", "--disk-path '/tmp' without --disk-quota");
  expect_sim_refuses("--backend gpu", "--backend: 'gpu' is not none, host or cuda");
  expect_sim_refuses("--colder-copies some", "--colder-copies: 'some' is not keep or drop");
  expect_sim_refuses("--admission lazy", "--admission: 'lazy' is not eager or budget");
  expect_sim_refuses("--host-link-gbps 50", "--host-link-gbps: '50' is not DOWN,UP");
  expect_sim_refuses("--disk-link-gbps 2,0", "--disk-link-gbps: '2,0' is not DOWN,UP");
  expect_sim_refuses("--backend none --verify", "--verify needs --backend host or cuda");
  expect_sim_refuses("--pp 2 --pp-rank 2", "pp_rank 2 must be < pp_size 2");
  const CliRun dir = run_cli("sim --model " + std::string(HKV_MODELS_DIR) + " --trace " + kSlice);
  EXPECT_EQ(dir.exit_code, 2);
  EXPECT_NE(dir.err.find("is a directory"), std::string::npos) << dir.err;
}

// Issue 36: numbers in flags were read with std::stoull, which takes a sign and stops at the
// first non-digit: periodic:-5 ran with an interval of 2^64 - 5 (snapshots off, exit 0).
TEST(Sim, NumbersInFlagsAreDigitsOnly) {
  for (const char* item :
       {"periodic:-5", "aligned-end:-1", "start:-1", "from-end:-3", "periodic:5x",
        "periodic:", "start:+4", "periodic:99999999999999999999"}) {
    SCOPED_TRACE(item);
    expect_sim_refuses(std::string("--snapshot-policy ") + item,
                       std::string("--snapshot-policy: '") + item + "'");
  }
  expect_sim_refuses("--snapshot-policy periodic:0", "snapshots.periodic_interval 0 must be > 0");
  expect_sim_refuses("--snapshot-policy aligned-end:0", "snapshots.aligned_end 0 must be > 0");
  for (const char* spec :
       {"synthetic:5x", "synthetic:5:-1", "synthetic:-5", "synthetic:", "synthetic:5:"}) {
    SCOPED_TRACE(spec);
    const CliRun r = run_cli("sim --model " + kModel + " --trace " + spec + " --quiet");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.err.find(std::string("--trace ") + spec + ": '"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("is not a count"), std::string::npos) << r.err;
  }
  // A PiB is a unit, not a parse error; an unknown unit is named as such.
  expect_sim_refuses("--gpu-quota 1PiB --host-quota 1XB", "--host-quota: '1XB': unknown unit 'XB'");
  const CliRun pib = run_cli("plan --model " + kModel + " --gpu-quota 0.25PiB --tp 8");
  EXPECT_EQ(pib.exit_code, 0) << pib.err;
}

// Issue 36: the floor check was not monotonic (62 MiB ran, 63 was refused, 64 ran, 65 was
// refused): the room kept for the longest request grew with the quota past it. Once a quota
// runs, every larger one runs.
TEST(Sim, ALargerGpuQuotaIsNeverRefusedWhereASmallerOneRan) {
  bool ran = false;
  for (int mib = 56; mib <= 72; ++mib) {
    const CliRun r =
        run_cli("sim --model " + kModel + " --trace synthetic:3 --tp 8 --max-batch 4 " +
                "--quiet --gpu-quota " + std::to_string(mib) + "MiB");
    if (ran) {
      EXPECT_EQ(r.exit_code, 0) << mib << " MiB: " << r.err;
    }
    ran = ran || r.exit_code == 0;
  }
  EXPECT_TRUE(ran);
}

// "none" turns the host and disk tiers off, as the help says; the GPU tier cannot be.
TEST(Sim, NoneTurnsAColderTierOff) {
  const CliRun r =
      run_cli("sim --model " + kModel + " --trace " + kSlice +
              " --limit 5 --tp 8 --gpu-quota 4GiB --host-quota none --disk-quota none");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("GPU tier"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("HOST tier"), std::string::npos) << r.out;
  expect_sim_refuses("--gpu-quota none", "--gpu-quota: 'none' does not start with a number");
}

// hash_ids must match input_length (one id per 512-token block); a mismatch names the line.
TEST(Sim, HashIdsThatDoNotMatchTheLengthAreRefused) {
  const std::string trace = scratch("mismatch.jsonl");
  std::ofstream(trace) << R"({"timestamp": 0, "input_length": 1000, "output_length": 2, )"
                       << R"("hash_ids": [1, 2]})"
                       << "\n"
                       << R"({"timestamp": 0, "input_length": 1000, "output_length": 2, )"
                       << R"("hash_ids": [1, 2, 3]})"
                       << "\n";
  const CliRun r = run_cli("sim --model " + kModel + " --trace " + trace);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("line 2: hash_ids holds 3 ids but input_length 1000 needs 2"),
            std::string::npos)
      << r.err;
  std::remove(trace.c_str());
}

// The largest synthetic trace is accepted: requests keep their ids, not their tokens.
TEST(Sim, TheLargestSyntheticTraceIsAccepted) {
  const CliRun r =
      run_cli("sim --model " + kModel + " --trace synthetic:1000000 --limit 200 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("200 requests"), std::string::npos) << r.out;
}

// The report says what ran and what its terms mean; the JSON holds every setting (enough to
// run it again); the plot shows reuse against its bound and memory per pool group, with the step
// count of the text; the progress output reaches 100 %.
TEST(Sim, ReportSaysWhatRanAndThePlotAgreesWithIt) {
  const std::string json = scratch("report.json"), svg = scratch("report.svg");
  const CliRun r =
      run_cli("sim --model " + kModel + " --trace " + kSlice +
              " --limit 40 --gpu-quota 4GiB --max-batch 8 --json " + json + " --svg " + svg);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("40/40 requests done (100%)"), std::string::npos) << r.err;
  for (const std::string& shown : std::vector<std::string>{
           "model               " + kModel, "trace               " + kSlice,
           "backend             none", std::string("GPU tier            4.00 GiB"),
           std::string("pool group 0 (state)"), std::string("max batch 8"),
           std::string("bound: what unlimited memory would reuse"), "JSON report         " + json,
           "plot                " + svg}) {
    EXPECT_NE(r.out.find(shown), std::string::npos) << shown << "\n" << r.out;
  }
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  const nlohmann::json& settings = j["settings"];
  for (const char* key :
       {"model", "trace", "limit", "gpu_quota", "host_quota", "disk_quota", "tp", "max_batch",
        "max_tokens_per_step", "snapshot_policy", "spec_tokens", "backend", "verify",
        "attention_only", "arrival", "step_ms", "typical_len"}) {
    EXPECT_TRUE(settings.contains(key)) << key;
  }
  EXPECT_EQ(settings["max_batch"].get<uint64_t>(), 8u);
  const std::string plot = slurp(svg);
  EXPECT_NE(plot.find("bound (unlimited memory)"), std::string::npos);
  EXPECT_NE(plot.find("pool group 1 (attention)"), std::string::npos);
  EXPECT_NE(
      plot.find("x: scheduler steps (" + std::to_string(j["steps"].get<uint64_t>()) + " in all)"),
      std::string::npos);
  std::remove(json.c_str());
  std::remove(svg.c_str());
}

}  // namespace
