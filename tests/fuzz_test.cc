// Randomized inputs to the validator and the config reader: no crash, every rejection explained.
#include <gtest/gtest.h>

#include <dirent.h>

#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hybridkv/model.h"
#include "hybridkv/plan.h"
#include "test_configs.h"

namespace hybridkv {
namespace {

uint32_t test_seed() {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  return seed;
}

uint64_t wild_u64(std::mt19937_64& rng) {
  switch (rng() % 6) {
    case 0:
      return 0;
    case 1:
      return rng() % 8;
    case 2:
      return rng() % 100000;
    case 3:
      return 1ull << (rng() % 64);
    case 4:
      return std::numeric_limits<uint64_t>::max() - rng() % 3;
    default:
      return rng();
  }
}

void mutate_config(ManagerConfig& c, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 16) {
      case 0:
        c.tokens_per_block = static_cast<uint32_t>(wild_u64(rng));
        break;
      case 1:
        c.max_util_for_resume = (static_cast<double>(rng() % 2000) - 500.0) / 1000.0;
        break;
      case 2:
        c.max_live_kv_caches = static_cast<uint32_t>(wild_u64(rng));
        break;
      case 3:
        if (!c.attention_layers.empty()) {
          c.attention_layers[rng() % c.attention_layers.size()].window =
              static_cast<uint32_t>(wild_u64(rng));
        }
        break;
      case 4:
        if (!c.attention_layers.empty()) {
          c.attention_layers[rng() % c.attention_layers.size()].sink_tokens =
              static_cast<uint32_t>(wild_u64(rng));
        }
        break;
      case 5:
        if (!c.ssm_layers.empty()) {
          auto& buffers = c.ssm_layers[rng() % c.ssm_layers.size()].buffers;
          if (!buffers.empty()) buffers[rng() % buffers.size()].bytes_per_page = wild_u64(rng);
        }
        break;
      case 6:
        if (!c.attention_layers.empty()) {
          auto& buffers = c.attention_layers[rng() % c.attention_layers.size()].buffers;
          if (!buffers.empty()) buffers[rng() % buffers.size()].bytes_per_page = wild_u64(rng);
        }
        break;
      case 7:
        c.tiers[0].quota_bytes = wild_u64(rng);
        break;
      case 8:
        c.tiers.push_back(
            {static_cast<TierKind>(rng() % 4), wild_u64(rng), rng() % 2 ? "/tmp/hkv" : ""});
        break;
      case 9: {
        std::vector<double> ratio(rng() % 6);
        for (double& r : ratio) r = static_cast<double>(rng() % 100) - 10.0;
        c.pool_ratio = ratio;
        break;
      }
      case 10: {
        BatchShape b;
        b.requests.resize(rng() % 6);
        for (RequestShape& r : b.requests)
          r = {wild_u64(rng) % (1ull << 42), wild_u64(rng) % (1ull << 42)};
        if (rng() % 2) b.shared_prefix_tokens = wild_u64(rng) % 100000;
        if (rng() % 2)
          c.typical_step = b;
        else
          c.constraints.push_back(b);
        break;
      }
      case 11:
        if (!c.attention_layers.empty()) {
          c.attention_layers[rng() % c.attention_layers.size()].id =
              static_cast<LayerId>(rng() % 8) - 2;
        }
        break;
      case 12:
        if (!c.ssm_layers.empty()) {
          auto& buffers = c.ssm_layers[rng() % c.ssm_layers.size()].buffers;
          if (!buffers.empty())
            buffers[rng() % buffers.size()].reuse_policy = static_cast<ReusePolicy>(rng() % 3);
        }
        break;
      case 13:
        if (!c.attention_layers.empty()) {
          auto& buffers = c.attention_layers[rng() % c.attention_layers.size()].buffers;
          if (!buffers.empty()) {
            const size_t length = rng() % 3;  // drawn before the character in every build
            buffers[rng() % buffers.size()].role =
                std::string(length, static_cast<char>(' ' + rng() % 90));
          }
        }
        break;
      case 14:
        c.enable_block_reuse = !c.enable_block_reuse;
        break;
      default:
        if (rng() % 2 && !c.attention_layers.empty())
          c.attention_layers.pop_back();
        else if (!c.ssm_layers.empty())
          c.ssm_layers.pop_back();
        break;
    }
  }
}

TEST(Fuzz, MutatedConfigsNeverCrashAndRejectionsHaveMessages) {
  const uint32_t seed = test_seed();
  std::mt19937_64 rng(seed);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 4000; ++i) {
    ManagerConfig c = testing::example_config();
    mutate_config(c, rng);
    Result<StoragePlan> plan = StoragePlan::build(c);
    if (plan.is_ok()) {
      ++accepted;
      // An accepted plan is coherent: every pool group holds at least its GPU floor.
      for (const PoolGroup& pg : plan->pool_groups()) {
        ASSERT_GE(plan->slots(TierKind::kGpu, pg.id), pg.floor_slots) << "seed " << seed;
      }
      (void)plan->gpu_kv_tokens();
      (void)plan->max_request_tokens();
    } else {
      ++rejected;
      ASSERT_FALSE(plan.status().message().empty()) << "seed " << seed << " iteration " << i;
    }
  }
  std::printf("accepted %d, rejected %d\n", accepted, rejected);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

std::vector<std::string> model_texts() {
  std::vector<std::string> out;
  DIR* dir = opendir(HKV_MODELS_DIR);
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.size() < 5 || name.substr(name.size() - 5) != ".json") continue;
    std::ifstream in(std::string(HKV_MODELS_DIR) + "/" + name);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(ss.str());
  }
  closedir(dir);
  return out;
}

nlohmann::json wild_value(std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0:
      return nullptr;
    case 1:
      return -static_cast<int64_t>(rng() % 1000);
    case 2:
      return wild_u64(rng);
    case 3:
      return "x";
    case 4:
      return nlohmann::json::array({1, 2});
    case 5:
      return nlohmann::json::object();
    case 6:
      return 3.5;
    default:
      return static_cast<int64_t>(rng() % 5);
  }
}

std::string mutate_json(const std::string& text, std::mt19937_64& rng) {
  if (rng() % 3 == 0) {
    // Byte-level damage: malformed JSON most of the time.
    std::string s = text;
    const int edits = 1 + static_cast<int>(rng() % 5);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s.erase(at, 1 + rng() % 8);
          break;
        case 1:
          s.insert(at, 1, "{}[]\",:0-9ae\x01"[rng() % 13]);
          break;
        default:
          s = s.substr(0, at);
          break;
      }
    }
    return s;
  }
  nlohmann::json j = nlohmann::json::parse(text);
  const int edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    std::vector<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
    if (keys.empty()) break;
    const std::string& key = keys[rng() % keys.size()];
    switch (rng() % 4) {
      case 0:
        j.erase(key);
        break;
      case 1:
        j[key] = wild_value(rng);
        break;
      case 2:
        if (j[key].is_array() && !j[key].empty())
          j[key][rng() % j[key].size()] = wild_value(rng);
        else if (j[key].is_string() && !j[key].get<std::string>().empty()) {
          std::string v = j[key];
          v[rng() % v.size()] = "M*-EX"[rng() % 5];
          j[key] = v;
        }
        break;
      default:
        if (j[key].is_number_unsigned()) j[key] = j[key].get<uint64_t>() * (rng() % 5);
        break;
    }
  }
  return j.dump();
}

TEST(Fuzz, MutatedModelConfigsNeverCrashAndRejectionsHaveMessages) {
  const std::vector<std::string> texts = model_texts();
  ASSERT_EQ(texts.size(), 18u);
  const uint32_t seed = test_seed();
  std::mt19937_64 rng(seed);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string text = mutate_json(texts[rng() % texts.size()], rng);
    ModelOptions options;
    options.tp_size = 1u << (rng() % 4);
    Result<ModelDescription> model = parse_model_config(text, options, "fuzz.json");
    if (!model.is_ok()) {
      ++rejected;
      ASSERT_EQ(model.status().message().rfind("fuzz.json: ", 0), 0u)
          << "seed " << seed << ": " << model.status().message();
      ASSERT_GT(model.status().message().size(), 11u);
      continue;
    }
    ++accepted;
    ManagerConfig c;
    c.attention_layers = model->attention_layer_configs(32);
    c.ssm_layers = model->ssm_layer_configs();
    c.tiers.push_back({TierKind::kGpu, 1ull << 30, ""});
    Result<StoragePlan> plan = StoragePlan::build(c);
    if (!plan.is_ok()) {
      ASSERT_FALSE(plan.status().message().empty()) << "seed " << seed;
    }
  }
  std::printf("accepted %d, rejected %d\n", accepted, rejected);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace hybridkv
