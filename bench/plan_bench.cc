// Cost of building storage plans and of token sizing (what an engine pays at start-up).
#include <benchmark/benchmark.h>

#include "bench_models.h"
#include "hybridkv/model.h"
#include "hybridkv/plan.h"

namespace hybridkv {
namespace {

ManagerConfig config_for(const char* file) {
  ManagerConfig c = model_config(file, 32);
  c.tiers = {{TierKind::kGpu, 40ull << 30, ""}, {TierKind::kHost, 200ull << 30, ""}};
  return c;
}

void BM_BuildPlanNemotronH(benchmark::State& state) {
  const ManagerConfig c = config_for("nemotron_h_8b.json");
  for (auto _ : state) benchmark::DoNotOptimize(StoragePlan::build(c));
}
BENCHMARK(BM_BuildPlanNemotronH);

void BM_BuildPlanFalconH1(benchmark::State& state) {
  const ManagerConfig c = config_for("falcon_h1_7b.json");  // 88 cache layers
  for (auto _ : state) benchmark::DoNotOptimize(StoragePlan::build(c));
}
BENCHMARK(BM_BuildPlanFalconH1);

void BM_QuotaForTokensNemotronH(benchmark::State& state) {
  const ManagerConfig c = config_for("nemotron_h_8b.json");
  for (auto _ : state) benchmark::DoNotOptimize(quota_for_tokens(c, 1000000));
}
BENCHMARK(BM_QuotaForTokensNemotronH);

void BM_ReadModelConfig(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(read_model_config(
        std::string(HKV_MODELS_DIR) + "/qwen3_next_80b_a3b.json", ModelOptions{}));
  }
}
BENCHMARK(BM_ReadModelConfig);

}  // namespace
}  // namespace hybridkv

BENCHMARK_MAIN();
