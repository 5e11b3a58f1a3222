// Issue 36: the command line's parsers fuzzed in process (the sanitizer build runs this too):
// random `plan` and `sim` command lines built from every flag with hostile values (signs, units,
// overflow, empty, garbage), snapshot-policy strings from random fragments, synthetic trace
// specs, and trace files whose lines are the bundled slice's, mutated. Every run must end with
// exit code 0 (it ran) or 2 (refused, with a message): no crash, no sanitizer report, no other
// code. Budget: HKV_CLI_FUZZ_SECONDS (default 20); the seed and the number of runs are printed.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli.h"

namespace {

const std::string kModels = HKV_MODELS_DIR;
const std::string kSlice = std::string(HKV_DATA_DIR) + "/mooncake_conversation_first1000.jsonl";

std::string pick(std::mt19937_64& rng, const std::vector<std::string>& from) {
  return from[rng() % from.size()];
}

// Numbers as a careless or hostile user writes them.
std::string wild_number(std::mt19937_64& rng) {
  static const std::vector<std::string> kNumbers = {"0",
                                                    "1",
                                                    "2",
                                                    "3",
                                                    "7",
                                                    "16",
                                                    "32",
                                                    "64",
                                                    "512",
                                                    "4096",
                                                    "-1",
                                                    "-5",
                                                    "+4",
                                                    "5x",
                                                    "",
                                                    " ",
                                                    "1e3",
                                                    "0x10",
                                                    "1.5",
                                                    "nan",
                                                    "inf",
                                                    "18446744073709551615",
                                                    "18446744073709551616",
                                                    "99999999999999999999",
                                                    "4294967296",
                                                    "2147483648",
                                                    "007",
                                                    "3 4",
                                                    "\xff\xfe"};
  return pick(rng, kNumbers);
}

std::string wild_bytes(std::mt19937_64& rng) {
  static const std::vector<std::string> kUnits = {"",    "B",  "KiB",  "MiB",  "GiB", "TiB",
                                                  "PiB", "KB", "MB",   "GB",   "TB",  "PB",
                                                  "XB",  "g",  " GiB", "GiBB", "iB"};
  static const std::vector<std::string> kValues = {"0",  "1",  "64", "256", "4",    "16",   "0.5",
                                                   "1.", ".5", "-1", "1e9", "8000", "none", ""};
  std::string value = pick(rng, kValues);  // one draw per statement: a seed replays alike
  return value + pick(rng, kUnits);
}

std::string wild_policy(std::mt19937_64& rng) {
  static const std::vector<std::string> kItems = {
      "periodic:", "aligned-end:", "start:",   "from-end:", "end", "no-end", "answer",
      "branch",    "demand",       "periodic", "",          ":",   ",",      "bogus"};
  std::string out;
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    if (i) out += ",";
    std::string item = pick(rng, kItems);
    if (!item.empty() && item.back() == ':') item += wild_number(rng);
    out += item;
  }
  return out;
}

// A trace file: lines of the bundled slice, some mutated (values replaced, cut, garbled).
std::string wild_trace(std::mt19937_64& rng, const std::vector<std::string>& lines,
                       const std::string& dir, int k) {
  const std::string path = dir + "/trace" + std::to_string(k) + ".jsonl";
  std::ofstream out(path);
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    std::string line = lines[rng() % lines.size()];
    switch (rng() % 6) {
      case 0:
        line = line.substr(0, rng() % (line.size() + 1));
        break;
      case 1: {
        const size_t at = line.find(':', rng() % line.size());
        if (at != std::string::npos) line.replace(at + 1, 1, " " + wild_number(rng) + ",");
        break;
      }
      case 2:
        line[rng() % line.size()] = static_cast<char>(rng() % 256);
        break;
      case 3:
        line = "{}";
        break;
      default:
        break;
    }
    out << line << "\n";
  }
  return path;
}

std::vector<std::string> sim_args(std::mt19937_64& rng, const std::vector<std::string>& lines,
                                  const std::string& dir, int k) {
  std::vector<std::string> a = {"hybridkv", "sim"};
  auto flag = [&](const std::string& name, const std::string& value) {
    a.push_back(name);
    a.push_back(value);
  };
  flag("--model", rng() % 8 ? kModels + "/" +
                                  pick(rng, {"nemotron_h_8b.json", "qwen3_next_80b_a3b.json",
                                             "gemma_3_12b.json", "jamba_v0_1.json"})
                            : pick(rng, {"/nonexistent.json", kModels, kSlice}));
  const int trace = static_cast<int>(rng() % 4);
  std::string synthetic;
  if (trace > 1) {  // one draw per statement: a seed replays alike in every build
    synthetic = "synthetic:" + wild_number(rng);
    if (rng() % 2) synthetic += ":" + wild_number(rng);
  }
  flag("--trace", trace == 0 ? kSlice : trace == 1 ? wild_trace(rng, lines, dir, k) : synthetic);
  flag("--limit", std::to_string(1 + rng() % 3));  // runs stay short
  flag("--backend", rng() % 10 ? "none" : pick(rng, {"gpu", ""}));
  flag("--gpu-quota", rng() % 3 ? pick(rng, {"4GiB", "1GiB", "16GiB"}) : wild_bytes(rng));
  if (rng() % 3 == 0) flag("--host-quota", wild_bytes(rng));
  if (rng() % 8 == 0) flag("--disk-quota", wild_bytes(rng));
  if (rng() % 8 == 0) flag("--disk-path", dir);
  for (const char* name : {"--tp", "--max-batch", "--max-tokens-per-step", "--spec-tokens",
                           "--typical-len", "--step-ms", "--host-link-gbps", "--disk-link-gbps"}) {
    if (rng() % 5 == 0) flag(name, wild_number(rng));
  }
  if (rng() % 3 == 0) flag("--snapshot-policy", wild_policy(rng));
  if (rng() % 5 == 0) flag("--snapshot-dtype", pick(rng, {"fp32", "bf16", "fp8", "fp16", ""}));
  if (rng() % 5 == 0) flag("--rebalance", pick(rng, {"on", "off", "maybe"}));
  if (rng() % 5 == 0) flag("--offload", pick(rng, {"selective", "all", "none"}));
  if (rng() % 5 == 0) flag("--eviction", pick(rng, {"priced", "snapshot-aware", "lru", "x"}));
  if (rng() % 5 == 0) flag("--colder-copies", pick(rng, {"keep", "drop", "x"}));
  if (rng() % 5 == 0) flag("--arrival", pick(rng, {"asap", "trace", "poisson", ""}));
  if (rng() % 5 == 0) flag("--admission", pick(rng, {"eager", "budget", "lazy"}));
  if (rng() % 6 == 0) flag("--json", dir + "/out.json");
  if (rng() % 6 == 0) flag("--write-trace", dir + "/written.jsonl");
  if (rng() % 4 == 0) a.push_back("--attention-only");
  if (rng() % 6 == 0) a.push_back("--compare");
  a.push_back("--quiet");
  return a;
}

std::vector<std::string> plan_args(std::mt19937_64& rng) {
  std::vector<std::string> a = {"hybridkv", "plan", "--model",
                                kModels + "/" +
                                    pick(rng, {"nemotron_h_8b.json", "kimi_linear_48b_a3b.json",
                                               "gpt_oss_20b.json", "falcon_h1_34b.json"})};
  for (const char* name :
       {"--tp", "--max-batch", "--typical-len", "--max-live", "--pp", "--pp-rank", "--spec-tokens",
        "--dummy-slots", "--tokens-per-block", "--max-util", "--max-rewind-len"}) {
    if (rng() % 4 == 0) {
      a.push_back(name);
      a.push_back(wild_number(rng));
    }
  }
  for (const char* name : {"--gpu-quota", "--host-quota", "--disk-quota"}) {
    if (rng() % 3 == 0) {
      a.push_back(name);
      a.push_back(wild_bytes(rng));
    }
  }
  for (const char* name : {"--kv-dtype", "--conv-dtype", "--ssm-dtype"}) {
    if (rng() % 6 == 0) {
      a.push_back(name);
      a.push_back(pick(rng, {"bf16", "fp8_e4m3", "float32", "int4", ""}));
    }
  }
  if (rng() % 4 == 0) a.push_back("--json");
  if (rng() % 6 == 0) a.push_back(pick(rng, {"--overlap", "--swa-scratch", "--no-block-reuse"}));
  return a;
}

// Runs the CLI in this process with its output sent to /dev/null.
int run_quietly(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const int out = dup(1), err = dup(2), null = open("/dev/null", O_WRONLY);
  dup2(null, 1);
  dup2(null, 2);
  const int code = hybridkv::tools::run_cli(static_cast<int>(args.size()), argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(out, 1);
  dup2(err, 2);
  close(out);
  close(err);
  close(null);
  return code;
}

TEST(CliFuzz, EveryCommandLineRunsOrIsRefused) {
  const uint64_t seed = std::random_device{}();
  const char* budget_env = std::getenv("HKV_CLI_FUZZ_SECONDS");
  const double budget = budget_env ? std::atof(budget_env) : 20.0;
  std::printf("seed %llu, budget %.0f s\n", static_cast<unsigned long long>(seed), budget);
  std::mt19937_64 rng(seed);
  std::vector<std::string> lines;
  {
    std::ifstream in(kSlice);
    for (std::string line; std::getline(in, line) && lines.size() < 200;) lines.push_back(line);
  }
  ASSERT_FALSE(lines.empty());
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("hkv_cli_fuzz_" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(dir);
  const auto start = std::chrono::steady_clock::now();
  int runs = 0, ran = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget) {
    const std::vector<std::string> args =
        rng() % 3 ? sim_args(rng, lines, dir, runs % 8) : plan_args(rng);
    const int code = run_quietly(args);
    std::string line;
    for (const std::string& s : args) line += "'" + s + "' ";
    ASSERT_TRUE(code == 0 || code == 2) << "exit code " << code << ": " << line;
    ran += code == 0;
    ++runs;
  }
  std::filesystem::remove_all(dir);
  std::printf("cli fuzz: %d command lines (%d ran, %d refused) in %.0f s\n", runs, ran, runs - ran,
              budget);
  EXPECT_GT(runs, 0);
}

}  // namespace
