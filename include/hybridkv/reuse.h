// Prefix reuse: what a request can take from the prefix tree, and what the tree reports.
//
// Committed blocks live in a radix tree per scope (lora_id, salt); requests in different scopes
// never share. A block's key is the hash of its parent's key followed by its tokens as 4-byte
// little-endian integers (and the 32-byte digests of multimodal items that start in it). A match
// walks full blocks by key, may end inside a block (partial reuse; without it, only at an exact
// committed endpoint that the lookup ends on), is trimmed by reuse_match_backoff, and is then
// pruned across REQUIRED groups until every one can restore it: an SSM group needs a snapshot
// exactly at the endpoint; an attention group needs every block a step from the endpoint reads.
// Where that cuts inside a full block, a partial sibling of the block (a shorter commit of the
// same tokens) is tried as the tail instead. OPTIONAL groups report their own endpoint instead.
//
// Thread-safety: value types.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "hybridkv/config.h"
#include "hybridkv/ids.h"

namespace hybridkv {

// Requests in different scopes never share pages.
struct ReuseScope {
  std::optional<uint64_t> lora_id;
  std::optional<uint64_t> salt;
  bool operator==(const ReuseScope&) const = default;
};

using BlockKey = std::array<uint8_t, 32>;

// A multimodal item (an image, audio clip) whose placeholder tokens start at `position`; its
// digest is hashed into the block that holds that position.
struct MultimodalItem {
  uint64_t position = 0;
  std::array<uint8_t, 32> digest{};
};

// One group's view of a match.
struct GroupReuse {
  ReusePolicy policy = ReusePolicy::kRequired;
  bool complete = false;  // the group can restore the whole match
  uint64_t endpoint = 0;  // tokens the group can restore from the tree
  uint64_t coverage = 0;  // attention: tokens covered by the group's pages from the start
  // The tokens whose pages (attention) or summary (an SSM snapshot stands for [0, endpoint))
  // the match supplies, as [begin, end) ranges in order: full attention [0, coverage); a window
  // its sink blocks and the w - 1 tokens before the endpoint (whole blocks).
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
};

struct ReuseMatch {
  uint64_t lookup_tokens = 0;      // tokens looked up (the prompt less its last token)
  uint64_t divergence_tokens = 0;  // tokens found in the tree before any trimming
  uint64_t hybrid_tokens = 0;      // after backoff and attention coverage, before SSM snapshots
  uint64_t reused_tokens = 0;      // what create() reuses
  // Of hybrid - reused: up to the deepest block end in (reused, hybrid] whose snapshot was
  // evicted or released (the rest never had one); 0 without a REQUIRED SSM group.
  uint64_t dropped_snapshot_tokens = 0;
  std::vector<GroupReuse> groups;  // by cache group id
  // Block ends on the matched path, past the reused tokens, where earlier lookups found
  // attention reuse but no snapshot (demand-driven snapshot points).
  std::vector<uint64_t> demand_points;
  // Invariant: reused <= hybrid <= divergence <= lookup; dropped_snapshot <= hybrid - reused.
};

struct GroupReuseStats {
  uint64_t lookups = 0;  // matches that involved the group
  uint64_t hits = 0;     // ... that reused at least one token for it
  uint64_t misses = 0;
  uint64_t reused_tokens = 0;
  uint64_t unreused_tokens = 0;          // looked-up tokens not reused
  uint64_t aligned_snapshot_hits = 0;    // SSM: snapshot at a block boundary
  uint64_t unaligned_snapshot_hits = 0;  // SSM: snapshot inside a block
  uint64_t snapshots_stored = 0;         // SSM: snapshots published to the tree
  uint64_t snapshots_removed = 0;        // SSM: snapshots dropped or unlinked
  uint64_t orphans_dropped = 0;  // attention: pages dropped with a full-attention block above
  std::array<uint64_t, 3> served_by_tier{};  // matched pages by their tier at match time
};

struct ReuseStats {
  std::vector<GroupReuseStats> groups;             // by cache group id
  std::array<uint64_t, 3> pages_served_by_tier{};  // reused pages by tier at match time
  uint64_t tree_blocks = 0;
};

enum class CacheEventKind : uint8_t { kStored, kRemoved, kUpdated };

// A change to the tree's pages, for engines that mirror the tree (KV-aware routers).
struct CacheEvent {
  CacheEventKind kind = CacheEventKind::kStored;
  BlockKey key{};
  BlockKey parent_key{};
  std::vector<int32_t> tokens;  // kStored only
  CacheGroupId group;
  TierKind tier = TierKind::kGpu;
  int32_t priority = 0;
};

}  // namespace hybridkv
