// A few Nemotron-H-8B requests (tensor parallel 8) on the GPU through the CUDA backend: their
// block tables and state indices, then one request suspended while others push its pages down
// to the pinned host tier and on to the disk, and resumed: its pages come back to the GPU,
// in other slots. Falls back to the host backend (with a note) where there is no GPU.
//   gpu_requests MODEL_JSON [DISK_DIRECTORY]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hybridkv/hybrid.h"
#include "hybridkv/model.h"
#include "hybridkv/units.h"

using namespace hybridkv;

namespace {

// State index and block tables (the first and last few entries of long ones).
void print_request(HybridCacheManager& h, uint64_t id) {
  KvCache& c = *h.cache(id);
  std::printf("request %llu: %s, %llu tokens\n", static_cast<unsigned long long>(id),
              cache_state_name(c.state()), static_cast<unsigned long long>(c.capacity()));
  for (const CacheGroup& g : h.plan().cache_groups()) {
    if (g.kind == GroupKind::kSsm) {
      std::printf("  group %u (SSM) state index %d\n", g.id.value, *c.state_index(g.id));
      continue;
    }
    std::printf("  group %u block table:", g.id.value);
    const Result<std::span<const int32_t>> table = c.block_table(g.id);
    if (!table) continue;
    const std::span<const int32_t> t = table.value();
    for (size_t i = 0; i < t.size(); ++i) {
      if (i == 8 && t.size() > 16) {
        std::printf(" ...");
        i = t.size() - 8;
      }
      std::printf(" %d", t[i]);
    }
    std::printf("\n");
  }
}

void print_tiers(HybridCacheManager& h) {
  const StorageStats stats = h.manager().storage_stats();
  for (const TierStorage& t : stats.tiers) {
    std::printf("  %-4s pages in use:", tier_kind_name(t.tier));
    for (const PoolGroupStorage& pg : t.pool_groups) {
      std::printf(" pool group %u: %llu", pg.pool_group.value,
                  static_cast<unsigned long long>(pg.total_slots - pg.free_slots));
    }
    std::printf("\n");
  }
}

int fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpu_requests MODEL_JSON [DISK_DIRECTORY]\n");
    return 2;
  }
  ModelOptions mo;
  mo.tp_size = 8;
  Result<ModelDescription> model = read_model_config(argv[1], mo);
  if (!model) return fail(model.status());
  ServingConfig s;
  s.max_batch = 4;
  s.tokens_per_block = 32;
  s.tiers = {{TierKind::kGpu, 96ull << 20, ""}, {TierKind::kHost, 8ull << 20, ""}};
  if (argc > 2) s.tiers.push_back({TierKind::kDisk, 1ull << 30, argv[2]});
  Result<std::unique_ptr<HybridCacheManager>> created =
      HybridCacheManager::create(*model, s, {BackendKind::kCuda});
  if (!created) {
    std::printf("(%s: running on the host backend instead)\n", created.status().message().c_str());
    created = HybridCacheManager::create(*model, s, {BackendKind::kHost});
  }
  if (!created) return fail(created.status());
  HybridCacheManager& h = **created;
  std::printf("backend %s\n\n", backend_kind_name(h.manager().backend_kind()));

  // Request 1: 6,000 tokens, on the GPU; then suspended.
  std::vector<int32_t> prompt(6000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  if (Status st = h.add_request(1, prompt); !st) return fail(st);
  if (Status st = h.resume(1); !st) return fail(st);
  if (Status st = h.resize(1, 6000, 0); !st) return fail(st);
  print_request(h, 1);
  if (Status st = h.suspend(1); !st) return fail(st);

  // Others take the GPU (and the host) until request 1's pages have moved down; at most three
  // of them live at a time.
  for (uint64_t id = 2; id <= 8; ++id) {
    for (int32_t& t : prompt) t += 100000;  // no shared prefix
    if (id >= 5) {
      if (Status st = h.free_request(id - 3); !st) return fail(st);
    }
    if (Status st = h.add_request(id, prompt); !st) return fail(st);
    if (Status st = h.resume(id); !st) return fail(st);
    if (Status st = h.resize(id, 6000, 0); !st) return fail(st);
    if (Status st = h.suspend(id); !st) return fail(st);
  }
  std::printf("\nafter 7 more requests (3 of them still suspended):\n");
  print_tiers(h);

  if (Status st = h.resume(1); !st) return fail(st);
  h.manager().synchronize();
  std::printf("\nrequest 1 resumed (its pages onboarded into these slots):\n");
  print_request(h, 1);
  print_tiers(h);
  if (Status st = h.manager().copy_status(); !st) return fail(st);
  return 0;
}
