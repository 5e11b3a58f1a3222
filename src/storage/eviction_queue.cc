#include "storage/eviction_queue.h"

#include <limits>

#include "util/check.h"

namespace hybridkv::storage {

void EvictionQueue::push_back(PageId id) {
  Page& p = at(id);
  HKV_CHECK(p.queue == QueueKind::kNone, "page %u already queued", id.value);
  Bucket& b = buckets_[key(p)];
  p.queue = kind_;
  p.prev = b.tail;
  p.next = kNoPage;
  if (b.tail != kNoPage)
    at(b.tail).next = id;
  else
    b.head = id;
  b.tail = id;
  ++size_;
}

void EvictionQueue::remove(PageId id) {
  Page& p = at(id);
  HKV_CHECK(p.queue == kind_, "page %u is not in this queue", id.value);
  auto it = buckets_.find(key(p));
  HKV_CHECK(it != buckets_.end(), "page %u: no bucket for rank %lld class %u", id.value,
            static_cast<long long>(p.rank()), p.age_class);
  Bucket& b = it->second;
  if (p.prev != kNoPage)
    at(p.prev).next = p.next;
  else
    b.head = p.next;
  if (p.next != kNoPage)
    at(p.next).prev = p.prev;
  else
    b.tail = p.prev;
  if (b.head == kNoPage) buckets_.erase(it);
  p.queue = QueueKind::kNone;
  p.prev = p.next = kNoPage;
  --size_;
}

PageId EvictionQueue::oldest_of_rank(Buckets::const_iterator it) const {
  if (it == buckets_.end()) return kNoPage;
  const int64_t rank = at(it->second.head).rank();
  PageId best = it->second.head;
  for (++it; it != buckets_.end() && at(it->second.head).rank() == rank; ++it) {
    if (at(it->second.head).evicted_before(at(best), *clock_)) best = it->second.head;
  }
  return best;
}

PageId EvictionQueue::front() const { return oldest_of_rank(buckets_.begin()); }

PageId EvictionQueue::front_not_demoted() const {
  // Demoted ranks are below every priority (Page::rank).
  return oldest_of_rank(
      buckets_.lower_bound(int64_t{std::numeric_limits<int32_t>::min()} * kAgeClasses));
}

std::vector<PageId> EvictionQueue::pages_in_order() const {
  std::vector<PageId> out;
  for (const auto& [rank, bucket] : buckets_) {
    for (PageId id = bucket.head; id != kNoPage; id = at(id).next) out.push_back(id);
  }
  return out;
}

}  // namespace hybridkv::storage
