// Configuration validation: every rejection names the field and the value.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "hybridkv/plan.h"
#include "test_configs.h"

namespace hybridkv {
namespace {

using testing::example_config;

struct InvalidCase {
  const char* name;
  std::function<void(ManagerConfig&)> mutate;
  const char* expected;  // substring of the error
};

const std::vector<InvalidCase>& invalid_cases() {
  static const std::vector<InvalidCase> cases = {
      {"zero tokens_per_block", [](ManagerConfig& c) { c.tokens_per_block = 0; },
       "tokens_per_block 0 must be > 0"},
      {"huge tokens_per_block", [](ManagerConfig& c) { c.tokens_per_block = 1u << 20; },
       "tokens_per_block 1048576 exceeds 65536"},
      {"no layers",
       [](ManagerConfig& c) {
         c.attention_layers.clear();
         c.ssm_layers.clear();
       },
       "attention_layers and ssm_layers are both empty"},
      {"negative layer id", [](ManagerConfig& c) { c.attention_layers[0].id = -3; },
       "attention_layers[0] (layer -3): id -3 must be >= 0"},
      {"duplicate layer id across kinds", [](ManagerConfig& c) { c.attention_layers[0].id = 0; },
       "ssm_layers[0] (layer 0): id 0 is already used by attention_layers[0] (layer 0)"},
      {"duplicate attention layer id", [](ManagerConfig& c) { c.attention_layers[2].id = 2; },
       "attention_layers[2] (layer 2): id 2 is already used by attention_layers[1] (layer 2)"},
      {"window zero", [](ManagerConfig& c) { c.attention_layers[1].window = 0; },
       "attention_layers[1] (layer 2): window 0 must be > 0 or unset"},
      {"sink tokens zero", [](ManagerConfig& c) { c.attention_layers[2].sink_tokens = 0; },
       "attention_layers[2] (layer 3): sink_tokens 0 must be > 0 or unset"},
      {"sinks without window", [](ManagerConfig& c) { c.attention_layers[0].sink_tokens = 4; },
       "attention_layers[0] (layer 1): sink_tokens 4 needs a window"},
      {"sinks above window", [](ManagerConfig& c) { c.attention_layers[2].sink_tokens = 40; },
       "attention_layers[2] (layer 3): sink_tokens 40 must be <= window 32"},
      {"attention layer without buffers",
       [](ManagerConfig& c) { c.attention_layers[0].buffers.clear(); },
       "attention_layers[0] (layer 1): buffers must not be empty"},
      {"ssm layer without buffers", [](ManagerConfig& c) { c.ssm_layers[0].buffers.clear(); },
       "ssm_layers[0] (layer 0): buffers must not be empty"},
      {"empty role", [](ManagerConfig& c) { c.attention_layers[0].buffers[0].role = ""; },
       "attention_layers[0] (layer 1).buffers[0]: role '' must be 1-64 characters"},
      {"role with a space",
       [](ManagerConfig& c) { c.ssm_layers[0].buffers[1].role = "conv state"; },
       "ssm_layers[0] (layer 0).buffers[1]: role 'conv state' must be 1-64 characters"},
      {"duplicate role", [](ManagerConfig& c) { c.attention_layers[0].buffers[1].role = "key"; },
       "attention_layers[0] (layer 1).buffers[1]: role 'key' appears twice in the layer"},
      {"huge page",
       [](ManagerConfig& c) { c.ssm_layers[0].buffers[0].bytes_per_page = 1ull << 41; },
       "ssm_layers[0] (layer 0).buffers[0] (ssm_state): bytes_per_page 2199023255552 exceeds"},
      {"page not a multiple of dtype",
       [](ManagerConfig& c) { c.ssm_layers[0].buffers[0].bytes_per_page = 4094; },
       "ssm_layers[0] (layer 0).buffers[0] (ssm_state): bytes_per_page 4094 is not a multiple of "
       "the fp32 element size 4"},
      {"no tiers", [](ManagerConfig& c) { c.tiers.clear(); },
       "tiers must not be empty: a GPU tier is required"},
      {"first tier not GPU", [](ManagerConfig& c) { c.tiers[0].kind = TierKind::kHost; },
       "tiers[0] (HOST): the first tier must be GPU"},
      {"duplicate tier",
       [](ManagerConfig& c) {
         c.tiers.push_back({TierKind::kGpu, 1 << 20, ""});
       },
       "tiers[1] (GPU): tier kind appears twice"},
      {"tiers out of order",
       [](ManagerConfig& c) {
         c.tiers.push_back({TierKind::kDisk, 1 << 30, "/tmp/x"});
         c.tiers.push_back({TierKind::kHost, 1 << 30, ""});
       },
       "tiers[2] (HOST): tiers must be ordered GPU, HOST, DISK"},
      {"zero quota", [](ManagerConfig& c) { c.tiers[0].quota_bytes = 0; },
       "tiers[0] (GPU): quota_bytes 0 must be > 0"},
      {"huge quota", [](ManagerConfig& c) { c.tiers[0].quota_bytes = 1ull << 62; },
       "tiers[0] (GPU): quota_bytes 4611686018427387904 exceeds"},
      {"disk without path",
       [](ManagerConfig& c) {
         c.tiers.push_back({TierKind::kDisk, 1 << 30, ""});
       },
       "tiers[1] (DISK): path must be set for DISK"},
      {"path on host tier",
       [](ManagerConfig& c) {
         c.tiers.push_back({TierKind::kHost, 1 << 30, "/mnt/x"});
       },
       "tiers[1] (HOST): path '/mnt/x' is only meaningful for DISK"},
      {"util zero", [](ManagerConfig& c) { c.max_util_for_resume = 0.0; },
       "max_util_for_resume 0 must be in (0, 1]"},
      {"util above one", [](ManagerConfig& c) { c.max_util_for_resume = 1.5; },
       "max_util_for_resume 1.5 must be in (0, 1]"},
      {"util NaN",
       [](ManagerConfig& c) { c.max_util_for_resume = std::numeric_limits<double>::quiet_NaN(); },
       "max_util_for_resume nan must be in (0, 1]"},
      {"max live zero", [](ManagerConfig& c) { c.max_live_kv_caches = 0; },
       "max_live_kv_caches 0 must be > 0 or unset"},
      {"empty pool ratio", [](ManagerConfig& c) { c.pool_ratio = std::vector<double>{}; },
       "pool_ratio must not be empty when set"},
      {"negative pool ratio",
       [](ManagerConfig& c) {
         c.pool_ratio = std::vector<double>{1, -2, 1, 1};
       },
       "pool_ratio[1] -2 must be finite and > 0"},
      {"infinite pool ratio",
       [](ManagerConfig& c) {
         c.pool_ratio = std::vector<double>{1, 1, std::numeric_limits<double>::infinity(), 1};
       },
       "pool_ratio[2] inf must be finite and > 0"},
      {"pool ratio of the wrong length",
       [](ManagerConfig& c) {
         c.pool_ratio = std::vector<double>{1, 1};
       },
       "pool_ratio has 2 entries but the plan has 4 pool groups"},
      {"empty typical step", [](ManagerConfig& c) { c.typical_step = BatchShape{}; },
       "typical_step: requests must not be empty"},
      {"history above capacity",
       [](ManagerConfig& c) {
         c.typical_step = BatchShape{{{64, 63}, {10, 11}}, {}};
       },
       "typical_step.requests[1]: history 11 must be <= capacity 10"},
      {"shared prefix above capacity",
       [](ManagerConfig& c) {
         c.constraints.push_back(BatchShape{{{64, 0}, {8, 0}}, 16});
       },
       "constraints[0].shared_prefix_tokens 16 exceeds requests[1].capacity 8"},
      {"shared prefix zero",
       [](ManagerConfig& c) {
         c.constraints.push_back(BatchShape{{{64, 0}}, 0});
       },
       "constraints[0].shared_prefix_tokens 0 must be > 0 or unset"},
      {"constraint above max live",
       [](ManagerConfig& c) {
         c.max_live_kv_caches = 2;
         c.constraints.push_back(BatchShape{{{64, 0}, {64, 0}, {64, 0}}, {}});
       },
       "constraints[0]: 3 requests exceed max_live_kv_caches 2"},
      {"all buffers zero-size",
       [](ManagerConfig& c) {
         for (auto& l : c.attention_layers)
           for (auto& b : l.buffers) b.bytes_per_page = 0;
         for (auto& l : c.ssm_layers)
           for (auto& b : l.buffers) b.bytes_per_page = 0;
       },
       "every buffer of every layer has bytes_per_page 0"},
  };
  return cases;
}

TEST(ConfigValidation, ExampleConfigIsValid) {
  EXPECT_TRUE(config_errors(example_config()).empty());
  EXPECT_TRUE(validate_config(example_config()).is_ok());
}

TEST(ConfigValidation, EveryInvalidConfigIsRejectedWithItsMessage) {
  std::set<std::string> messages;
  for (const InvalidCase& c : invalid_cases()) {
    SCOPED_TRACE(c.name);
    ManagerConfig config = example_config();
    c.mutate(config);
    Result<StoragePlan> plan = StoragePlan::build(config);
    ASSERT_FALSE(plan.is_ok());
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(c.expected), std::string::npos)
        << "message: " << plan.status().message();
    messages.insert(plan.status().message());
  }
  EXPECT_GE(invalid_cases().size(), 30u);
  EXPECT_EQ(messages.size(), invalid_cases().size()) << "every case has its own message";
}

TEST(ConfigValidation, ReportsEveryErrorAtOnce) {
  ManagerConfig c = example_config();
  c.tokens_per_block = 0;
  c.max_util_for_resume = 2.0;
  c.attention_layers[1].window = 0;
  const std::vector<std::string> errors = config_errors(c);
  ASSERT_EQ(errors.size(), 3u);
  const Status s = validate_config(c);
  EXPECT_NE(s.message().find("tokens_per_block 0"), std::string::npos);
  EXPECT_NE(s.message().find("max_util_for_resume 2"), std::string::npos);
  EXPECT_NE(s.message().find("window 0"), std::string::npos);
}

// Issue 36: a config with 2^20 bad layers printed a 235 MB error line. The first 20
// problems are listed, then one entry counts the rest.
TEST(ConfigValidation, ManyProblemsMakeOneShortMessage) {
  ManagerConfig c = example_config();
  AttentionLayerConfig bad = c.attention_layers[0];
  bad.buffers[0].bytes_per_page = 1ull << 50;  // a PiB per page
  const size_t n = 1u << 17;
  c.attention_layers.assign(n, bad);
  for (size_t i = 0; i < n; ++i) c.attention_layers[i].id = static_cast<LayerId>(100 + i);
  const std::vector<std::string> errors = config_errors(c);
  ASSERT_EQ(errors.size(), 21u);
  EXPECT_NE(errors[0].find("attention_layers[0] (layer 100)"), std::string::npos) << errors[0];
  EXPECT_NE(errors.back().find("... and " + std::to_string(n - 20) + " more (" + std::to_string(n) +
                               " problems in all)"),
            std::string::npos)
      << errors.back();
  const Status s = validate_config(c);
  EXPECT_LT(s.message().size(), 10000u);
}

TEST(ConfigValidation, ZeroSizeBufferIsAllowedAndDropped) {
  ManagerConfig c = example_config();
  c.attention_layers[0].buffers.push_back({"key_block_scale", 0, {}, {}});
  Result<StoragePlan> plan = StoragePlan::build(c);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->buffer_group_id(1, "key_block_scale").status().code(), StatusCode::kNotFound);
}

TEST(ConfigNames, DtypeNamesParseBackToTheirDtype) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2,
                  DType::kINT8, DType::kUINT8}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_FALSE(parse_dtype("fp12").has_value());
  for (ReusePolicy p : {ReusePolicy::kRequired, ReusePolicy::kOptional, ReusePolicy::kPrivate}) {
    EXPECT_EQ(parse_reuse_policy(reuse_policy_name(p)), p);
  }
  EXPECT_FALSE(parse_reuse_policy("sometimes").has_value());
}

}  // namespace
// Taking the value of an error is a caller bug: it aborts and says which error it was.
TEST(ResultDeathTest, ValueOfAnErrorAbortsPrintingTheStatus) {
  const Result<int> r = Status::invalid("layer 7: window 0 must be > 0");
  EXPECT_DEATH((void)r.value(), "invalid argument: layer 7: window 0 must be > 0");
}

TEST(ResultDeathTest, ResultBuiltFromAnOkStatusIsACheckFailure) {
  EXPECT_DEATH({ const Result<int> r{Status::ok()}; }, "Result built from an OK status");
}

}  // namespace hybridkv
