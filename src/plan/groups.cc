// Buffers -> cache groups (DESIGN §2).
#include <algorithm>
#include <map>
#include <tuple>

#include "plan/plan_internal.h"
#include "util/blocks.h"

namespace hybridkv::plan_detail {
namespace {

// The sort key of a cache group: the order of DESIGN §2 ("SSM groups first (REQUIRED, OPTIONAL,
// PRIVATE), then full attention, then sliding windows by increasing window, then sinks, then
// policy"). Full attention sorts before every window through has_window = false.
struct GroupKey {
  int kind_rank;   // 0 = SSM, 1 = attention
  int has_window;  // 0 = full attention
  uint64_t window;
  uint32_t sink_blocks;
  int policy;
  auto operator<=>(const GroupKey&) const = default;
};

struct PendingBuffer {
  LayerId layer;
  size_t declared;  // index of the buffer within its layer
  const BufferConfig* config;
  ReusePolicy policy;
};

}  // namespace

void build_groups(const ManagerConfig& config, Structure& s) {
  std::map<GroupKey, std::vector<PendingBuffer>> by_key;
  const uint32_t tpb = config.tokens_per_block;
  for (const AttentionLayerConfig& layer : config.attention_layers) {
    const uint32_t sinks = layer.sink_tokens ? blocks_for(*layer.sink_tokens, tpb) : 0;
    for (size_t i = 0; i < layer.buffers.size(); ++i) {
      const BufferConfig& b = layer.buffers[i];
      if (b.bytes_per_page == 0) continue;  // dropped without changing the layer's policy
      const ReusePolicy policy = b.reuse_policy.value_or(layer.reuse_policy);
      const GroupKey key{1, layer.window ? 1 : 0, layer.window.value_or(0), sinks,
                         static_cast<int>(policy)};
      by_key[key].push_back({layer.id, i, &b, policy});
    }
  }
  for (const SsmLayerConfig& layer : config.ssm_layers) {
    for (size_t i = 0; i < layer.buffers.size(); ++i) {
      const BufferConfig& b = layer.buffers[i];
      if (b.bytes_per_page == 0) continue;
      const ReusePolicy policy = b.reuse_policy.value_or(layer.reuse_policy);
      by_key[GroupKey{0, 0, 0, 0, static_cast<int>(policy)}].push_back({layer.id, i, &b, policy});
    }
  }

  s.groups.clear();
  s.buffers.clear();
  for (auto& [key, pending] : by_key) {
    // Slot order inside a group: by layer id, then by declaration order within the layer.
    std::sort(pending.begin(), pending.end(), [](const PendingBuffer& a, const PendingBuffer& b) {
      return std::tie(a.layer, a.declared) < std::tie(b.layer, b.declared);
    });
    CacheGroup group;
    group.id = CacheGroupId(static_cast<uint32_t>(s.groups.size()));
    group.kind = key.kind_rank == 0 ? GroupKind::kSsm : GroupKind::kAttention;
    group.policy = static_cast<ReusePolicy>(key.policy);
    if (key.has_window) group.window = static_cast<uint32_t>(key.window);
    group.sink_blocks = key.sink_blocks;
    for (const PendingBuffer& p : pending) {
      if (group.layers.empty() || group.layers.back() != p.layer) group.layers.push_back(p.layer);
      PlannedBuffer buffer;
      buffer.layer = p.layer;
      buffer.role = p.config->role;
      buffer.policy = p.policy;
      buffer.dtype = p.config->dtype;
      buffer.group = group.id;
      buffer.size = p.config->bytes_per_page;
      group.buffers.push_back(static_cast<uint32_t>(s.buffers.size()));
      s.buffers.push_back(std::move(buffer));
    }
    if (group.kind == GroupKind::kSsm || !group.window) {
      group.one_request_slots = 1;
    } else {
      // w consecutive tokens (the token being computed and the w - 1 before it) touch at most
      // ceil((w - 1) / tpb) + 1 blocks; sink blocks are kept besides.
      group.one_request_slots = blocks_for(*group.window - 1, tpb) + 1 + group.sink_blocks;
    }
    s.groups.push_back(std::move(group));
  }
}

}  // namespace hybridkv::plan_detail
