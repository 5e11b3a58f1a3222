// KeyIndex: block key -> tree node, open addressing with linear probing. Slots keep the whole
// key, so a lookup touches one cache line (and can be prefetched): with a million blocks the
// index is the dominant memory access of a match.
//
// Growing never stalls a call: past 3/8 full, the doubled table is written a slice per insert
// or erase (its memory faulted in gradually), then the entries are copied into it a slice at a
// time while lookups look in both; inserts go to the new table once it is ready. The slices
// finish before the old table is half full (3/8 + 3/32 of its slots), so probe chains stay
// short throughout (a whole-table rehash took 8 ms at 2^18 slots and 40+ ms at 2^19 on the
// conversation trace, in one commit).
//
// Thread-safety: none (the manager's lock covers it).
#pragma once

#include <cstddef>
#include <vector>

#include "hybridkv/ids.h"
#include "prefix/block_hash.h"
#include "util/huge_pages.h"

namespace hybridkv::prefix {

struct NodeTag {};
using NodeId = StrongId<NodeTag>;  // a tree block
inline constexpr NodeId kNoNode{};

class KeyIndex {
 public:
  NodeId find(const BlockKey& key) const;
  void insert(const BlockKey& key, NodeId id);  // Requires: key absent
  void erase(const BlockKey& key);              // Requires: key present
  void prefetch(const BlockKey& key) const {
    const Table& t = phase_ == Phase::kCopying ? next_ : slots_;
    if (!t.empty()) __builtin_prefetch(&t[home(t, key)]);
  }
  size_t size() const { return size_; }
  bool growing() const { return phase_ != Phase::kSteady; }
  // Slots of the table inserts go to (tests: growth in slices).
  size_t capacity() const { return (phase_ == Phase::kCopying ? next_ : slots_).size(); }

  static constexpr size_t kSlice = 32;  // slots written or copied per insert or erase

 private:
  struct Slot {
    BlockKey key;
    NodeId id = kNoNode;
  };
  using Table = std::vector<Slot, HugePageAllocator<Slot>>;
  enum class Phase { kSteady, kPreparing, kCopying };
  // An erased entry of the old table while its entries are being copied (no backward shift
  // there: it could move an uncopied entry behind the copy cursor).
  static constexpr NodeId kErased{UINT32_MAX - 1};

  static size_t home(const Table& t, const BlockKey& key) {
    return BlockKeyHash()(key) & (t.size() - 1);
  }
  // The slot holding `key` in `t`, or t.size().
  static size_t locate(const Table& t, const BlockKey& key);
  static void place(Table& t, const BlockKey& key, NodeId id);
  static void remove_at(Table& t, size_t i);  // backward-shift deletion
  void grow_slice();

  Phase phase_ = Phase::kSteady;
  Table slots_;        // the table (while copying: the old one, read and erased from only)
  Table next_;         // while growing: the doubled table, its capacity reserved
  size_t copied_ = 0;  // slots_ entries below this were copied into next_
  size_t size_ = 0;
};

}  // namespace hybridkv::prefix
