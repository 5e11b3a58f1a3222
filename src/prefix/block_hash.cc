#include "prefix/block_hash.h"

#include <openssl/evp.h>

#include <cstring>
#include <vector>

#include "util/check.h"

namespace hybridkv::prefix {

struct BlockHasher::Impl {
  EVP_MD* md = nullptr;
  EVP_MD_CTX* ctx = nullptr;
  std::vector<uint8_t> buffer;
};

BlockHasher::BlockHasher(BlockHash kind) : kind_(kind), impl_(new Impl) {
  if (kind_ == BlockHash::kSha256) {
    // Fetched once: implicit fetches per digest cost more than the digest of a small block.
    impl_->md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    impl_->ctx = EVP_MD_CTX_new();
    HKV_CHECK(impl_->md != nullptr && impl_->ctx != nullptr, "OpenSSL SHA-256 is unavailable");
  }
}

BlockHasher::~BlockHasher() {
  if (impl_->ctx) EVP_MD_CTX_free(impl_->ctx);
  if (impl_->md) EVP_MD_free(impl_->md);
}

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

void BlockHasher::hash(std::span<const uint8_t> a, std::span<const uint8_t> b, BlockKey& out) {
  if (kind_ == BlockHash::kSha256) {
    unsigned int len = 0;
    HKV_CHECK(EVP_DigestInit_ex(impl_->ctx, impl_->md, nullptr) == 1 &&
                  EVP_DigestUpdate(impl_->ctx, a.data(), a.size()) == 1 &&
                  EVP_DigestUpdate(impl_->ctx, b.data(), b.size()) == 1 &&
                  EVP_DigestFinal_ex(impl_->ctx, out.data(), &len) == 1 && len == 32,
              "SHA-256 failed");
    return;
  }
  // Four independent 64-bit lanes over 8-byte words: fast, not collision-resistant.
  uint64_t lanes[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                       0x082efa98ec4e6c89ull};
  uint64_t n = 0;
  auto feed = [&](std::span<const uint8_t> bytes) {
    size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8, ++n) {
      uint64_t w;
      std::memcpy(&w, bytes.data() + i, 8);
      lanes[n & 3] = mix(lanes[n & 3] ^ w ^ n);
    }
    uint64_t w = 0;
    std::memcpy(&w, bytes.data() + i, bytes.size() - i);
    lanes[n & 3] = mix(lanes[n & 3] ^ w ^ (bytes.size() - i) << 56 ^ n);
    ++n;
  };
  feed(a);
  feed(b);
  for (int r = 0; r < 2; ++r) {
    for (int l = 0; l < 4; ++l) lanes[l] = mix(lanes[l] ^ lanes[(l + 1) & 3] ^ n);
  }
  std::memcpy(out.data(), lanes, 32);
}

BlockKey BlockHasher::root(const ReuseScope& scope) {
  uint8_t bytes[18] = {};
  bytes[0] = scope.lora_id.has_value();
  bytes[1] = scope.salt.has_value();
  const uint64_t lora = scope.lora_id.value_or(0), salt = scope.salt.value_or(0);
  for (int i = 0; i < 8; ++i) {
    bytes[2 + i] = static_cast<uint8_t>(lora >> (8 * i));
    bytes[10 + i] = static_cast<uint8_t>(salt >> (8 * i));
  }
  static const char kTag[] = "hybridkv scope root";
  BlockKey out;
  hash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(kTag), sizeof(kTag) - 1),
       std::span<const uint8_t>(bytes, sizeof(bytes)), out);
  return out;
}

BlockKey BlockHasher::key(const BlockKey& parent, std::span<const int32_t> tokens,
                          std::span<const std::array<uint8_t, 32>> digests) {
  // Tokens as 4-byte little-endian integers, then the digests (DESIGN §6).
  std::vector<uint8_t>& buf = impl_->buffer;
  buf.resize(tokens.size() * 4 + digests.size() * 32);
  uint8_t* p = buf.data();
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    p[0] = static_cast<uint8_t>(u);
    p[1] = static_cast<uint8_t>(u >> 8);
    p[2] = static_cast<uint8_t>(u >> 16);
    p[3] = static_cast<uint8_t>(u >> 24);
    p += 4;
  }
  for (const auto& d : digests) {
    std::memcpy(p, d.data(), 32);
    p += 32;
  }
  BlockKey out;
  hash(parent, buf, out);
  return out;
}

}  // namespace hybridkv::prefix
