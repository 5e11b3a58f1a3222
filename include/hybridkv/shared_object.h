// One object of the shared tier (DESIGN §8a): a committed block of a cache group (per
// tensor-parallel rank) or an SSM snapshot, self-describing and checksummed so that a reader in
// another process trusts nothing it cannot check. Layout, little-endian:
//   magic "HKVS" | version u16 | kind u8 | 0 u8 | fingerprint u64 | token digest u64 |
//   payload length u64 | payload | xxHash3-64 of everything before it
// A reader gives what it expects (kind, the model-and-layout fingerprint, the digest of the
// block's tokens); any difference, a short object or a wrong checksum is an error: a miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hybridkv/status.h"

namespace hybridkv {

enum class SharedObjectKind : uint8_t { kKvBlock = 1, kSnapshot = 2 };

struct SharedObjectHeader {
  SharedObjectKind kind = SharedObjectKind::kKvBlock;
  uint64_t fingerprint = 0;   // the model and pool layout (every process computes the same)
  uint64_t token_digest = 0;  // the block's tokens (a colliding key cannot pass for them)
};

inline constexpr uint16_t kSharedObjectVersion = 1;
inline constexpr size_t kSharedObjectHeaderBytes = 32;
inline constexpr size_t kSharedObjectTrailerBytes = 8;

// The object for `payload`: header, payload, checksum.
std::vector<std::byte> encode_shared_object(const SharedObjectHeader& header,
                                            std::span<const std::byte> payload);

// Writes the header and checksum around a payload already in place: `object` is
// kSharedObjectHeaderBytes + payload + kSharedObjectTrailerBytes bytes.
void seal_shared_object(const SharedObjectHeader& header, std::span<std::byte> object);

// The payload of `object` (a view into it) when it is whole and is what the reader expects;
// otherwise an error saying what differs (kIoError).
Result<std::span<const std::byte>> open_shared_object(std::span<const std::byte> object,
                                                      const SharedObjectHeader& expected);

// The key of an object: deterministic in every process (no per-process seed):
// "hkv1:<fingerprint>:r<rank>:<k|s><cache group>:<chain digest>", digests in hex.
std::string shared_object_key(uint64_t fingerprint, uint32_t rank, SharedObjectKind kind,
                              uint32_t cache_group, uint64_t chain_digest);

}  // namespace hybridkv
