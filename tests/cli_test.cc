// The `hybridkv plan` command: JSON figures for every bundled model, and bad input that exits 2
// with one line on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {

using hybridkv::testing::CliRun;
using hybridkv::testing::run_cli;
using hybridkv::testing::scratch;
using hybridkv::testing::slurp;

std::string model(const std::string& name) { return std::string(HKV_MODELS_DIR) + "/" + name; }

struct Row {
  const char* file;
  uint64_t kv;
  uint64_t state;
};

TEST(CliPlan, JsonReportsTheTableFiguresForEveryModel) {
  const Row rows[] = {
      {"nemotron_h_8b.json", 16384, 102137856},
      {"nemotron_nano_9b_v2.json", 16384, 143548416},
      {"nemotron_3_nano_30b_a3b.json", 6144, 49082368},
      {"qwen3_next_80b_a3b.json", 24576, 77266944},
      {"jamba_v0_1.json", 16384, 16056320},
      {"falcon_h1_7b.json", 45056, 139358208},
      {"granite_4_0_h_tiny.json", 8192, 57341952},
      {"granite_4_0_h_small.json", 16384, 152819712},
      {"kimi_linear_48b_a3b.json", 8064, 43417600},
      {"zamba2_2_7b.json", 184320, 72479232},
      {"mamba2_2_7b.json", 0, 169836544},
      {"mistral_7b_v0_1.json", 131072, 0},
      {"gemma_3_270m.json", 18432, 0},
      {"gpt_oss_20b.json", 49152, 0},
      {"gemma_3_12b.json", 393216, 0},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.file);
    const CliRun r = run_cli("plan --model " + model(row.file) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["model"]["kv_bytes_per_token"].get<uint64_t>(), row.kv);
    EXPECT_EQ(j["model"]["state_bytes_per_sequence"].get<uint64_t>(), row.state);
    EXPECT_EQ(j["model"]["tp"].get<int>(), 1);
    EXPECT_FALSE(j["cache_groups"].empty());
    EXPECT_FALSE(j["tiers"][0]["pool_groups"].empty());
  }
}

// The bytes per rank (issue 34 item 4): pipeline ranks partition the layers, so their rows add
// up to the whole model's figures at TP 1; with TP 2 each row is one rank's share, the same for
// every tensor-parallel rank of it.
TEST(CliPlan, RanksAddUpToTheWholeModel) {
  const Row rows[] = {{"nemotron_h_8b.json", 16384, 102137856},
                      {"qwen3_next_80b_a3b.json", 24576, 77266944},
                      {"jamba_v0_1.json", 16384, 16056320},
                      {"granite_4_0_h_small.json", 16384, 152819712}};
  for (const Row& row : rows) {
    for (const int pp : {2, 3}) {
      SCOPED_TRACE(std::string(row.file) + " pp " + std::to_string(pp));
      const CliRun r =
          run_cli("plan --model " + model(row.file) + " --pp " + std::to_string(pp) + " --json");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const nlohmann::json j = nlohmann::json::parse(r.out);
      ASSERT_EQ(j["ranks"].size(), static_cast<size_t>(pp));
      uint64_t kv = 0, state = 0;
      for (const nlohmann::json& rank : j["ranks"]) {
        EXPECT_GT(
            rank["attention_layers"].get<uint64_t>() + rank["recurrent_layers"].get<uint64_t>(),
            0u);
        kv += rank["kv_bytes_per_token"].get<uint64_t>();
        state += rank["state_bytes_per_sequence"].get<uint64_t>();
      }
      EXPECT_EQ(kv, row.kv);
      EXPECT_EQ(state, row.state);
    }
  }
  const CliRun tp2 = run_cli("plan --model " + model("nemotron_h_8b.json") + " --tp 2 --pp 2");
  ASSERT_EQ(tp2.exit_code, 0) << tp2.err;
  EXPECT_NE(tp2.out.find("ranks (TP 2 x PP 2"), std::string::npos) << tp2.out;
  EXPECT_NE(tp2.out.find("all 4 ranks: KV 16,384 B/token, state 102,137,856 B/sequence"),
            std::string::npos)
      << tp2.out;
}

TEST(CliPlan, TextPlanShowsGroupsPoolsTiersAndTokens) {
  const CliRun r = run_cli("plan --model " + model("nemotron_h_8b.json") +
                           " --gpu-quota 8GiB --host-quota 32GiB --max-batch 16 --max-live 40");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* expected :
       {"cache groups", "SSM REQUIRED", "full attention REQUIRED", "pool groups", "floor",
        "GPU  quota 8.00 GiB", "HOST  quota 32.00 GiB", "KV tokens on GPU", "max_live_kv_caches 40",
        "unassigned", "state floor: 17 GPU slots"}) {
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << r.out;
  }
}

TEST(CliPlan, SwaScratchShowsItsSlotsAndBadValuesAreNamed) {
  const CliRun r = run_cli("plan --model " + model("gemma_3_12b.json") +
                           " --swa-scratch --max-rewind-len 4 --max-batch 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // An 8,192-token prefill settles at 8,188: a step from there reads from block
  // (8,188 + 1 - 1,024) / 32 = 223, so blocks 0..222 are scratch; 40 layers x (key, value) a
  // slot, 2 pages a layer's block: ceil(223 x 2 / 80) = 6 slots.
  EXPECT_NE(r.out.find("swa scratch: a 8,192-token prefill maps 223 stale blocks onto 6 scratch "
                       "slots (max_rewind_len 4)"),
            std::string::npos)
      << r.out;
  const CliRun j = run_cli("plan --model " + model("gemma_3_12b.json") + " --swa-scratch --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const nlohmann::json plan = nlohmann::json::parse(j.out);
  EXPECT_EQ(plan["cache_groups"][1]["swa_scratch"]["scratch_slots"].get<uint64_t>(), 6u);
  const CliRun negative =
      run_cli("plan --model " + model("gemma_3_12b.json") + " --swa-scratch --max-rewind-len -3");
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_NE(negative.err.find("max_rewind_len -3 must be >= 0"), std::string::npos);
  const CliRun beyond = run_cli("plan --model " + model("gemma_3_12b.json") +
                                " --swa-scratch --max-rewind-len 100000000 --gpu-quota 8GiB");
  EXPECT_EQ(beyond.exit_code, 2);
  EXPECT_NE(beyond.err.find("max_rewind_len 100000000 is beyond the longest request"),
            std::string::npos)
      << beyond.err;
  const CliRun no_window =
      run_cli("plan --model " + model("nemotron_h_8b.json") + " --swa-scratch");
  EXPECT_EQ(no_window.exit_code, 2);
  EXPECT_NE(no_window.err.find("no attention layer has a sliding window"), std::string::npos);
}

TEST(CliPlan, JsonTiersReportUnassignedBytesUnderOneSlot) {
  const CliRun r = run_cli("plan --model " + model("nemotron_h_8b.json") +
                           " --gpu-quota 8GiB --host-quota 32GiB --max-batch 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  uint64_t smallest = UINT64_MAX;
  for (const auto& pg : j["pool_groups"]) {
    if (!pg["fixed_private"].get<bool>())
      smallest = std::min(smallest, pg["slot_bytes"].get<uint64_t>());
  }
  for (const auto& t : j["tiers"]) {
    EXPECT_EQ(t["bytes_used"].get<uint64_t>() + t["unassigned_bytes"].get<uint64_t>(),
              t["quota"].get<uint64_t>());
    EXPECT_LT(t["unassigned_bytes"].get<uint64_t>(), smallest);
  }
}

TEST(CliPlan, SmallQuotaIsRaisedAndSaysSo) {
  const CliRun r =
      run_cli("plan --model " + model("nemotron_h_8b.json") + " --gpu-quota 1MiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["tiers"][0]["quota_raised"].get<bool>());
  ASSERT_FALSE(j["notes"].empty());
  EXPECT_NE(j["notes"][0].get<std::string>().find("GPU quota raised"), std::string::npos);
}

TEST(CliPlan, NoBlockReuseHoldsTheSsmPoolAtTheLiveFloor) {
  const CliRun r = run_cli("plan --model " + model("nemotron_h_8b.json") +
                           " --no-block-reuse --max-batch 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["pool_groups"][0]["live_floor"].get<bool>());
  // 8 requests -> N = 8 + 1 living caches; ceil(9 / 0.97) = 10 states.
  EXPECT_EQ(j["tiers"][0]["pool_groups"][0]["slots"].get<uint64_t>(), 10u);
}

TEST(CliPlan, ServingFlagsShowStateAndReplayGroupsForEveryModel) {
  const char* files[] = {
      "nemotron_h_8b.json",      "nemotron_nano_9b_v2.json", "nemotron_3_nano_30b_a3b.json",
      "qwen3_next_80b_a3b.json", "jamba_v0_1.json",          "falcon_h1_7b.json",
      "granite_4_0_h_tiny.json", "granite_4_0_h_small.json", "kimi_linear_48b_a3b.json",
      "zamba2_2_7b.json",        "mamba2_2_7b.json",         "mistral_7b_v0_1.json",
      "gemma_3_270m.json",       "gpt_oss_20b.json",         "gemma_3_12b.json"};
  for (const char* file : files) {
    for (int tp : {1, 2, 4}) {
      SCOPED_TRACE(std::string(file) + " tp " + std::to_string(tp));
      const CliRun r = run_cli("plan --model " + model(file) + " --tp " + std::to_string(tp) +
                               " --max-batch 64 --spec-tokens 3 --json");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const nlohmann::json j = nlohmann::json::parse(r.out);
      bool state = false, replay = false;
      for (const auto& g : j["cache_groups"]) {
        for (const auto& b : g["buffers"]) {
          state = state || b["role"] == "ssm_state";
          replay = replay || b["role"].get<std::string>().rfind("replay_", 0) == 0;
        }
      }
      const bool recurrent = j["model"]["recurrent_layers"].get<int>() > 0;
      EXPECT_EQ(state, recurrent);
      EXPECT_EQ(replay, recurrent && std::string(file) != "jamba_v0_1.json");  // Mamba1: none
      EXPECT_EQ(j["config"]["max_live_kv_caches"].get<int>(), 65);
    }
  }
  const CliRun ring = run_cli("plan --model " + model("qwen3_next_80b_a3b.json") +
                              " --spec-tokens 3 --replay-layout ring --pp 2 --pp-rank 1 --json");
  ASSERT_EQ(ring.exit_code, 0) << ring.err;
  const CliRun bad = run_cli("plan --model " + model("nemotron_h_8b.json") +
                             " --spec-tokens 3 --replay-layout ring");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("replay_layout ring is only for GDN models"), std::string::npos);
}

void expect_bad_input(const std::string& args, const std::string& expected) {
  SCOPED_TRACE(args);
  const CliRun r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  EXPECT_NE(r.err.find(expected), std::string::npos) << r.err;
}

TEST(CliPlan, BadInputExitsTwoWithOneLine) {
  expect_bad_input("plan --model /nonexistent.json", "/nonexistent.json: cannot open the file");
  const std::string malformed = scratch("malformed.json");
  std::ofstream(malformed) << "{\"model_type\": ";
  expect_bad_input("plan --model " + malformed, "malformed JSON");
  const std::string unknown = scratch("unknown.json");
  std::ofstream(unknown) << R"({"model_type": "transformer9000"})";
  expect_bad_input("plan --model " + unknown, "'transformer9000' is unknown");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --gpu-quota 12XB",
                   "--gpu-quota: '12XB': unknown unit 'XB'");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --host-quota lots",
                   "--host-quota: 'lots' does not start with a number");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --tp 3",
                   "is not divisible by tp 3");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --tp 0", "--tp");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --max-util 1.5",
                   "max_util_for_resume 1.5 must be in (0, 1]");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --kv-dtype fp12",
                   "--kv-dtype: unknown dtype 'fp12'");
  expect_bad_input("plan", "--model is required");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --bogus", "bogus");
  std::remove(malformed.c_str());
  std::remove(unknown.c_str());
}

// Huge batch sizes are refused at once with the reason, instead of sizing a plan for them.
TEST(CliPlan, ValuesBeyondAnyQuotaAreRefusedAtOnce) {
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --max-batch 100000000",
                   "beyond what any GPU quota could hold");
  expect_bad_input("plan --model " + model("nemotron_h_8b.json") + " --dummy-slots 100000000",
                   "100000065 living caches");
}

TEST(CliPlan, ModelConfigMistakesAreNamed) {
  // A directory instead of its config.json.
  expect_bad_input("plan --model " + std::string(HKV_MODELS_DIR), "is a directory");
  // A misspelt checkpoint dtype is refused, not ignored.
  std::ifstream in(model("nemotron_h_8b.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["torch_dtype"] = "bfloat61";
  const std::string path = scratch("bad_dtype.json");
  std::ofstream(path) << j.dump();
  expect_bad_input("plan --model " + path, "field 'torch_dtype': 'bfloat61' is not a dtype");
  std::remove(path.c_str());
}

TEST(Cli, VersionHelpDefaultsAndTypos) {
  const CliRun version = run_cli("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find("hybridkv 0."), std::string::npos) << version.out;
  const CliRun help = run_cli("sim --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* shown : {"--gpu-quota TEXT=40GiB", "--backend TEXT=none", "--limit UINT=0",
                            "0: all of them", "--max-batch UINT=64"}) {
    EXPECT_NE(help.out.find(shown), std::string::npos) << shown << "\n" << help.out;
  }
  const CliRun plan_help = run_cli("plan --help");
  EXPECT_NE(plan_help.out.find("0: keep the serving formula"), std::string::npos) << plan_help.out;
  const CliRun typo = run_cli("simm --model x");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.err.find("did you mean 'sim'?"), std::string::npos) << typo.err;
}

}  // namespace
