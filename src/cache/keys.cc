// Prompt keys computed ahead (KvCacheManager::hash_prompt): built here, and checked against the
// prompt they are handed with, so that keys of another prompt never reach the tree (a wrong key
// would hand a request another prompt's KV).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/manager_core.h"
#include "util/xxh3.h"

namespace hybridkv::cache_detail {
namespace {

// The tokens and the multimodal items' positions and digests.
uint64_t fingerprint(std::span<const int32_t> tokens, std::span<const MultimodalItem> items) {
  uint64_t h = util::xxh3_64(tokens.data(), tokens.size_bytes());
  for (const MultimodalItem& item : items) {
    h = XXH3_64bits_withSeed(item.digest.data(), item.digest.size(), h ^ item.position);
  }
  return h;
}

}  // namespace

std::shared_ptr<const PromptKeys> CoreAccess::make_keys(const ManagerConfig& config,
                                                        const ReuseScope& scope,
                                                        std::span<const int32_t> tokens,
                                                        std::span<const MultimodalItem> multimodal,
                                                        std::vector<BlockKey> keys) {
  auto k = std::make_shared<PromptKeys>();
  k->scope_ = scope;
  k->tokens_per_block_ = config.tokens_per_block;
  k->kind_ = config.block_hash;
  k->tokens_ = tokens.size();
  k->fingerprint_ = fingerprint(tokens, multimodal);
  k->keys_ = std::move(keys);
  return k;
}

Status CoreAccess::check_keys(const PromptKeys& keys, const ManagerConfig& config,
                              const ReuseScope& scope, std::span<const int32_t> tokens,
                              std::span<const MultimodalItem> multimodal) {
  const std::string what = "prompt_keys: computed for ";
  if (keys.tokens_per_block_ != config.tokens_per_block || keys.kind_ != config.block_hash) {
    if (keys.tokens_per_block_ == config.tokens_per_block)
      return Status::invalid(what + "another block_hash than this manager's");
    return Status::invalid(what + "tokens_per_block " + std::to_string(keys.tokens_per_block_) +
                           "; this manager's is " + std::to_string(config.tokens_per_block));
  }
  if (!(keys.scope_ == scope)) return Status::invalid(what + "another reuse scope");
  if (keys.tokens_ != tokens.size() || keys.fingerprint_ != fingerprint(tokens, multimodal)) {
    return Status::invalid(what + "another prompt (" + std::to_string(keys.tokens_) +
                           " tokens; this one has " + std::to_string(tokens.size()) + ")");
  }
  return Status::ok();
}

}  // namespace hybridkv::cache_detail
