// `hybridkv sim --instances N --router random|prefix --shared-quota BYTES` (issue 33 item 7): a
// fleet in one process on the bundled slice, with the shared tier modelled in memory (none
// backend). Each instance's figures add up to the fleet's, the tier is used and stays within its
// quota, a run repeats exactly, and bad flags are refused by name before any work.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {

using hybridkv::testing::run_cli;
using hybridkv::testing::scratch;
using hybridkv::testing::slurp;

const std::string kSlice = std::string(HKV_DATA_DIR) + "/mooncake_conversation_first1000.jsonl";
const std::string kModel = std::string(HKV_MODELS_DIR) + "/nemotron_h_8b.json";
#ifdef HKV_SANITIZED
constexpr int kLimit = 100;
#else
constexpr int kLimit = 400;
#endif

nlohmann::json fleet(const std::string& flags) {
  const std::string json = scratch("fleet.json");
  const auto r = run_cli(
      "sim --model " + kModel + " --trace " + kSlice + " --limit " + std::to_string(kLimit) +
      " --tp 8 --gpu-quota 2GiB --host-quota 4GiB --max-batch 16 --json " + json + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.out << r.err;
  const std::string text = slurp(json);
  std::remove(json.c_str());
  return text.empty() ? nlohmann::json{} : nlohmann::json::parse(text);
}

TEST(SimFleet, InstancesAddUpAndTheSharedTierServesThemWithinItsQuota) {
  for (const std::string router : {"prefix", "random"}) {
    const nlohmann::json j = fleet("--instances 3 --router " + router + " --shared-quota 2GiB");
    ASSERT_EQ(j["per_instance"].size(), 3u) << router;
    uint64_t requests = 0, reused = 0, prompt = 0, hits = 0, published = 0;
    for (const nlohmann::json& one : j["per_instance"]) {
      requests += one["requests"].get<uint64_t>();
      reused += one["reused_tokens"].get<uint64_t>();
      prompt += one["prompt_tokens"].get<uint64_t>();
      hits += one["shared"]["hit_tokens"].get<uint64_t>();
      published += one["shared"]["objects_published"].get<uint64_t>();
      EXPECT_EQ(one["shared"]["objects_corrupt"], 0u);
      EXPECT_EQ(one["shared"]["objects_dropped"], 0u);
    }
    EXPECT_EQ(requests, static_cast<uint64_t>(kLimit)) << router;
    EXPECT_EQ(j["reused_tokens"].get<uint64_t>(), reused) << router;
    EXPECT_EQ(j["prompt_tokens"].get<uint64_t>(), prompt) << router;
    EXPECT_LE(reused, j["reuse_bound_tokens"].get<uint64_t>()) << router;
    EXPECT_GT(published, 0u) << router;
    EXPECT_GT(hits, 0u) << router << ": no instance found another's prefix in the tier";
    EXPECT_LE(j["shared_store"]["bytes"].get<uint64_t>(), 2ull << 30) << router;
    EXPECT_GT(j["shared_store"]["evictions"].get<uint64_t>(), 0u) << router << ": quota unused";
  }
}

TEST(SimFleet, ARunRepeatsExactlyAndTheTierIsOffWithoutAQuota) {
  const std::string flags = "--instances 2 --router random --shared-quota 1GiB";
  nlohmann::json a = fleet(flags), b = fleet(flags);
  ASSERT_EQ(a["per_instance"].size(), 2u);
  for (nlohmann::json* run : {&a, &b}) {
    for (nlohmann::json& one : (*run)["per_instance"]) one.erase("shared_fetch_seconds");  // a time
  }
  EXPECT_EQ(a["per_instance"], b["per_instance"]);
  EXPECT_EQ(a["shared_store"], b["shared_store"]);
  const nlohmann::json off = fleet("--instances 2 --router random");
  ASSERT_EQ(off["per_instance"].size(), 2u);
  EXPECT_FALSE(off["per_instance"][0].contains("shared"));
  EXPECT_FALSE(off.contains("shared_store"));
  // The same routing: the same requests on each instance.
  for (size_t k = 0; k < 2; ++k)
    EXPECT_EQ(off["per_instance"][k]["requests"], a["per_instance"][k]["requests"]);
}

TEST(SimFleet, BadFleetFlagsAreRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"--instances 0", "--instances: 0 must be > 0"},
      {"--instances 2 --router nearest", "--router: 'nearest' is not random or prefix"},
      {"--instances 2 --shared-quota lots", "--shared-quota: 'lots' is not a byte count"},
      {"--shared-quota 1GiB", "--shared-quota needs --instances above 1"},
      {"--instances 2 --instance 0/2", "--instances and --instance"},
      {"--instances 2 --backend host --verify", "--verify runs one instance"},
      {"--instances 2 --shared-quota 1GiB --shared-redis 127.0.0.1:1",
       "--shared-quota and --shared-redis"},
  };
  for (const auto& [flags, message] : cases) {
    const auto r = run_cli("sim --model " + kModel + " --trace " + kSlice + " --limit 5 " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << "\n" << r.err;
    EXPECT_EQ(r.out, "") << flags;
  }
}

}  // namespace
