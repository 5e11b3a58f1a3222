// Builds a plan through the installed headers and library; exits 0 when it looks right.
#include <cstdio>

#include <hybridkv/plan.h>

int main() {
  hybridkv::ManagerConfig config;
  config.tokens_per_block = 16;
  hybridkv::AttentionLayerConfig attention;
  attention.id = 0;
  attention.buffers = {{"key", 4096, {}, {}}, {"value", 4096, {}, {}}};
  config.attention_layers.push_back(attention);
  config.tiers.push_back({hybridkv::TierKind::kGpu, 64ull << 20, ""});
  hybridkv::Result<hybridkv::StoragePlan> plan = hybridkv::StoragePlan::build(config);
  if (!plan) {
    std::fprintf(stderr, "consumer: %s\n", plan.status().to_string().c_str());
    return 1;
  }
  const uint64_t slots = plan->slots(hybridkv::TierKind::kGpu, hybridkv::PoolGroupId(0));
  std::printf("consumer: %zu cache group(s), %llu GPU slots\n", plan->cache_groups().size(),
              static_cast<unsigned long long>(slots));
  return plan->cache_groups().size() == 1 && slots == (64ull << 20) / 8192 ? 0 : 1;
}
