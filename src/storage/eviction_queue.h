// EvictionQueue: pages of one (tier, pool group) and one kind (HELD or DROPPABLE), lowest
// rank (demoted first, then priority) first and, within a rank, the longest weighted wait
// first (Page::weighted_age: least recently used first among pages of one age class).
// Buckets per (rank, age class) hold intrusive doubly linked lists threaded through the pages'
// prev/next fields, in LRU order.
//
// Only Storage uses it (it is the only writer of a page's queue links).
// Cost: push/remove O(log B) for B buckets in use; front O(log B + age classes).
#pragma once

#include <map>
#include <vector>

#include "storage/page.h"

namespace hybridkv::storage {

class EvictionQueue {
 public:
  // `clock`: the storage's tick, read to weigh waits.
  EvictionQueue(std::vector<Page>* pages, QueueKind kind, const uint64_t* clock)
      : pages_(pages), kind_(kind), clock_(clock) {}

  // Requires: the page is in no queue.
  void push_back(PageId id);
  // Requires: the page is in this queue.
  void remove(PageId id);
  // The next victim, or kNoPage.
  PageId front() const;
  // The first page in order that is not demoted, or kNoPage.
  PageId front_not_demoted() const;
  uint64_t size() const { return size_; }
  // Every page, bucket by bucket: (rank, age class) ascending, LRU within a bucket (for the
  // checker and dumps).
  std::vector<PageId> pages_in_order() const;

 private:
  struct Bucket {
    PageId head;
    PageId tail;
  };
  using Buckets = std::map<int64_t, Bucket>;
  static int64_t key(const Page& p) { return p.rank() * kAgeClasses + p.age_class; }
  Page& at(PageId id) const { return (*pages_)[id.value]; }
  // The longest weighted wait among the heads of the buckets of `first`'s rank.
  PageId oldest_of_rank(Buckets::const_iterator first) const;
  std::vector<Page>* pages_;
  QueueKind kind_;
  const uint64_t* clock_;
  Buckets buckets_;  // by key()
  uint64_t size_ = 0;
};

}  // namespace hybridkv::storage
