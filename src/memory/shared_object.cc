// Shared-tier objects: header, payload, xxHash3 checksum (hybridkv/shared_object.h).
#include "hybridkv/shared_object.h"

#include <cstdio>
#include <cstring>

#include "util/check.h"
#include "util/xxh3.h"

namespace hybridkv {
namespace {

constexpr char kMagic[4] = {'H', 'K', 'V', 'S'};

void put_u64(std::byte* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = std::byte((v >> (8 * i)) & 0xff);
}

uint64_t get_u64(const std::byte* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(std::to_integer<uint8_t>(at[i])) << (8 * i);
  return v;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status corrupt(const std::string& what) {
  return Status(StatusCode::kIoError, "shared object: " + what);
}

}  // namespace

void seal_shared_object(const SharedObjectHeader& header, std::span<std::byte> object) {
  const size_t framing = kSharedObjectHeaderBytes + kSharedObjectTrailerBytes;
  HKV_CHECK(object.size() >= framing, "seal_shared_object: %zu bytes", object.size());
  std::byte* out = object.data();
  std::memcpy(out, kMagic, 4);
  out[4] = std::byte(kSharedObjectVersion & 0xff);
  out[5] = std::byte(kSharedObjectVersion >> 8);
  out[6] = std::byte(static_cast<uint8_t>(header.kind));
  out[7] = std::byte{0};
  put_u64(out + 8, header.fingerprint);
  put_u64(out + 16, header.token_digest);
  put_u64(out + 24, object.size() - framing);
  const size_t body = object.size() - kSharedObjectTrailerBytes;
  put_u64(out + body, util::xxh3_64(out, body));
}

std::vector<std::byte> encode_shared_object(const SharedObjectHeader& header,
                                            std::span<const std::byte> payload) {
  std::vector<std::byte> out(kSharedObjectHeaderBytes + payload.size() + kSharedObjectTrailerBytes);
  if (!payload.empty()) {
    std::memcpy(out.data() + kSharedObjectHeaderBytes, payload.data(), payload.size());
  }
  seal_shared_object(header, out);
  return out;
}

Result<std::span<const std::byte>> open_shared_object(std::span<const std::byte> object,
                                                      const SharedObjectHeader& expected) {
  const size_t framing = kSharedObjectHeaderBytes + kSharedObjectTrailerBytes;
  if (object.size() < framing) {
    return corrupt(std::to_string(object.size()) + " bytes, shorter than its " +
                   std::to_string(framing) + "-byte framing");
  }
  if (std::memcmp(object.data(), kMagic, 4) != 0) return corrupt("no HKVS magic");
  const unsigned version =
      std::to_integer<unsigned>(object[4]) | (std::to_integer<unsigned>(object[5]) << 8);
  if (version != kSharedObjectVersion) {
    return corrupt("version " + std::to_string(version) + ", this reader knows " +
                   std::to_string(kSharedObjectVersion));
  }
  const uint64_t length = get_u64(object.data() + 24);
  if (length != object.size() - framing) {
    return corrupt("payload length " + std::to_string(length) + " but " +
                   std::to_string(object.size() - framing) + " bytes follow the header");
  }
  const size_t body = kSharedObjectHeaderBytes + length;
  const uint64_t sum = util::xxh3_64(object.data(), body);
  if (sum != get_u64(object.data() + body)) {
    return corrupt("checksum " + hex(get_u64(object.data() + body)) + " is not the content's " +
                   hex(sum));
  }
  const auto kind = static_cast<SharedObjectKind>(std::to_integer<uint8_t>(object[6]));
  if (kind != expected.kind) {
    return corrupt("kind " + std::to_string(static_cast<int>(kind)) + ", expected " +
                   std::to_string(static_cast<int>(expected.kind)));
  }
  if (get_u64(object.data() + 8) != expected.fingerprint) {
    return corrupt("fingerprint " + hex(get_u64(object.data() + 8)) + " is not this layout's " +
                   hex(expected.fingerprint));
  }
  if (get_u64(object.data() + 16) != expected.token_digest) {
    return corrupt("token digest " + hex(get_u64(object.data() + 16)) + " is not the block's " +
                   hex(expected.token_digest));
  }
  return object.subspan(kSharedObjectHeaderBytes, length);
}

std::string shared_object_key(uint64_t fingerprint, uint32_t rank, SharedObjectKind kind,
                              uint32_t cache_group, uint64_t chain_digest) {
  return "hkv1:" + hex(fingerprint) + ":r" + std::to_string(rank) + ":" +
         (kind == SharedObjectKind::kKvBlock ? "k" : "s") + std::to_string(cache_group) + ":" +
         hex(chain_digest);
}

}  // namespace hybridkv
