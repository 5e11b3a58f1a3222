// EvictionQueue: pages of one (tier, pool group) and one kind (HELD or DROPPABLE), lowest
// rank (demoted first, then priority) first and least recently used first within a priority.
// Buckets per priority hold intrusive doubly linked lists threaded through the pages' prev/next
// fields.
//
// Only Storage uses it (it is the only writer of a page's queue links).
// Cost: push/remove O(log P) for P distinct priorities in use; front O(log P).
#pragma once

#include <map>
#include <vector>

#include "storage/page.h"

namespace hybridkv::storage {

class EvictionQueue {
 public:
  EvictionQueue(std::vector<Page>* pages, QueueKind kind) : pages_(pages), kind_(kind) {}

  // Requires: the page is in no queue.
  void push_back(PageId id);
  // Requires: the page is in this queue.
  void remove(PageId id);
  // The next victim, or kNoPage.
  PageId front() const;
  // The first page in order that is not demoted, or kNoPage.
  PageId front_not_demoted() const;
  uint64_t size() const { return size_; }
  // Every page in eviction order (for the checker and tests).
  std::vector<PageId> pages_in_order() const;

 private:
  struct Bucket {
    PageId head;
    PageId tail;
  };
  Page& at(PageId id) const { return (*pages_)[id.value]; }
  std::vector<Page>* pages_;
  QueueKind kind_;
  std::map<int64_t, Bucket> buckets_;  // by Page::rank()
  uint64_t size_ = 0;
};

}  // namespace hybridkv::storage
