// Block keys: hash(parent key ‖ tokens as 4-byte little-endian ‖ multimodal digests).
//
// Thread-safety: a BlockHasher is used by one thread at a time (it keeps a digest context).
#pragma once

#include <memory>
#include <span>

#include "hybridkv/reuse.h"

namespace hybridkv::prefix {

class BlockHasher {
 public:
  explicit BlockHasher(BlockHash kind);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  // The key of a scope's root: every block key chains from it, so scopes never share keys.
  BlockKey root(const ReuseScope& scope);
  // The key of a block: its parent's key, its tokens, and the digests of items starting in it.
  BlockKey key(const BlockKey& parent, std::span<const int32_t> tokens,
               std::span<const std::array<uint8_t, 32>> digests = {});

 private:
  void hash(std::span<const uint8_t> a, std::span<const uint8_t> b, BlockKey& out);
  BlockHash kind_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const noexcept {
    size_t h;
    static_assert(sizeof(h) <= sizeof(BlockKey));
    __builtin_memcpy(&h, k.data(), sizeof(h));
    return h;
  }
};

}  // namespace hybridkv::prefix
