#include "prefix/key_index.h"

#include <algorithm>

#include "util/check.h"

namespace hybridkv::prefix {

size_t KeyIndex::locate(const Table& t, const BlockKey& key) {
  if (t.empty()) return 0;
  const size_t mask = t.size() - 1;
  for (size_t i = home(t, key);; i = (i + 1) & mask) {
    const Slot& s = t[i];
    if (s.id == kNoNode) return t.size();
    if (s.id != kErased && s.key == key) return i;
  }
}

void KeyIndex::place(Table& t, const BlockKey& key, NodeId id) {
  const size_t mask = t.size() - 1;
  size_t i = home(t, key);
  while (t[i].id != kNoNode) i = (i + 1) & mask;
  t[i] = {key, id};
}

void KeyIndex::remove_at(Table& t, size_t i) {
  const size_t mask = t.size() - 1;
  // Backward-shift deletion: keeps every probe chain unbroken without tombstones.
  for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (t[j].id == kNoNode) break;
    const size_t h = home(t, t[j].key);
    // Move slot j into the hole at i if i lies cyclically in [h, j).
    const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
    if (movable) {
      t[i] = t[j];
      i = j;
    }
  }
  t[i] = Slot{};
}

NodeId KeyIndex::find(const BlockKey& key) const {
  if (phase_ == Phase::kCopying) {
    const size_t i = locate(next_, key);
    if (i != next_.size()) return next_[i].id;
  }
  const size_t i = locate(slots_, key);
  return i == slots_.size() ? kNoNode : slots_[i].id;
}

void KeyIndex::insert(const BlockKey& key, NodeId id) {
  if (slots_.empty()) slots_.assign(1024, Slot{});
  if (phase_ == Phase::kSteady && (size_ + 1) * 8 > slots_.size() * 3) {
    phase_ = Phase::kPreparing;
    next_.reserve(slots_.size() * 2);  // reserved, not yet written
  }
  grow_slice();
  Table& t = phase_ == Phase::kCopying ? next_ : slots_;
  HKV_CHECK((size_ + 1) * 2 <= t.size(), "key index past half full while growing");
  place(t, key, id);
  ++size_;
}

void KeyIndex::erase(const BlockKey& key) {
  if (phase_ == Phase::kCopying) {
    const size_t in_next = locate(next_, key), in_old = locate(slots_, key);
    HKV_CHECK(in_next != next_.size() || in_old != slots_.size(),
              "erasing a key the index does not hold");
    if (in_next != next_.size()) remove_at(next_, in_next);
    if (in_old != slots_.size()) slots_[in_old].id = kErased;
  } else {
    const size_t i = locate(slots_, key);
    HKV_CHECK(i != slots_.size(), "erasing a key the index does not hold");
    remove_at(slots_, i);
  }
  --size_;
  grow_slice();
}

// One slice of growth: kSlice slots of the new table written, or kSlice old slots copied.
void KeyIndex::grow_slice() {
  if (phase_ == Phase::kPreparing) {
    const size_t target = slots_.size() * 2;
    next_.resize(next_.size() + std::min(kSlice, target - next_.size()));  // within capacity
    if (next_.size() == target) phase_ = Phase::kCopying;
    return;
  }
  if (phase_ != Phase::kCopying) return;
  const size_t end = std::min(copied_ + kSlice, slots_.size());
  for (; copied_ < end; ++copied_) {
    const Slot& s = slots_[copied_];
    if (s.id != kNoNode && s.id != kErased) place(next_, s.key, s.id);
  }
  if (copied_ < slots_.size()) return;
  slots_ = std::move(next_);
  next_ = Table();
  copied_ = 0;
  phase_ = Phase::kSteady;
}

}  // namespace hybridkv::prefix
