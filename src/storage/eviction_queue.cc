#include "storage/eviction_queue.h"

#include <limits>

#include "util/check.h"

namespace hybridkv::storage {

void EvictionQueue::push_back(PageId id) {
  Page& p = at(id);
  HKV_CHECK(p.queue == QueueKind::kNone, "page %u already queued", id.value);
  Bucket& b = buckets_[p.rank()];
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
  auto it = buckets_.find(p.rank());
  HKV_CHECK(it != buckets_.end(), "page %u: no bucket for rank %lld", id.value,
            static_cast<long long>(p.rank()));
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

PageId EvictionQueue::front() const {
  return buckets_.empty() ? kNoPage : buckets_.begin()->second.head;
}

PageId EvictionQueue::front_not_demoted() const {
  // Demoted ranks are below every priority (Page::rank).
  const auto it = buckets_.lower_bound(std::numeric_limits<int32_t>::min());
  return it == buckets_.end() ? kNoPage : it->second.head;
}

std::vector<PageId> EvictionQueue::pages_in_order() const {
  std::vector<PageId> out;
  for (const auto& [rank, bucket] : buckets_) {
    for (PageId id = bucket.head; id != kNoPage; id = at(id).next) out.push_back(id);
  }
  return out;
}

}  // namespace hybridkv::storage
