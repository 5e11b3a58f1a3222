// The shipped eviction policies: one queue, ranked LRU, read through three sets of verdicts.
//
// Rule: lowest rank first (demoted pages below every priority, then Page::priority), and
// within a rank the longest weighted wait: (tick - lru_tick) x 2^((age_class - 4) / 4), so a
// page of a cheap class ages faster than a neutral one used as recently.
//  - "priced" (default): the prefix index demotes tree pages no request can resume from and
//    prices each snapshot (its age class: tokens of recompute saved per byte, issue 12).
//  - "snapshot-aware": demotion only; every page ages alike.
//  - "lru": neither: (priority, LRU), as an attention-only cache.
// Cost: buckets per (rank, age class) hold intrusive doubly linked lists threaded through the
// pages' prev/next fields in LRU order: push/remove O(log B) for B buckets in use; front
// O(log B + age classes).
#include <limits>
#include <map>
#include <tuple>

#include "storage/eviction_policy.h"
#include "util/check.h"

namespace hybridkv::storage {
namespace {

// A page's rank in a queue of `kind`: a HELD page's holder resumes into it whatever the tree's
// verdict, so demotion (Page::rank) orders only the DROPPABLE pages.
int64_t queue_rank(const Page& p, QueueKind kind) {
  return kind == QueueKind::kHeld ? int64_t{p.priority} : p.rank();
}

class RankedLruQueue final : public EvictionQueue {
 public:
  RankedLruQueue(PageTable* pages, QueueKind kind, const uint64_t* clock)
      : pages_(pages), kind_(kind), clock_(clock) {}

  void push_back(PageId id) override {
    Page& p = at(id);
    HKV_CHECK(p.queue == QueueKind::kNone, "page %u already queued", id.value);
    Bucket& b = buckets_[key(p)];
    p.prev = b.tail;
    p.next = kNoPage;
    if (b.tail != kNoPage)
      at(b.tail).next = id;
    else
      b.head = id;
    b.tail = id;
    ++size_;
  }

  void remove(PageId id) override {
    Page& p = at(id);
    HKV_CHECK(p.queue == kind_, "page %u is not in this queue", id.value);
    auto it = buckets_.find(key(p));
    HKV_CHECK(it != buckets_.end(), "page %u: no bucket for rank %lld class %u", id.value,
              static_cast<long long>(rank_of(p)), p.age_class);
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
    p.prev = p.next = kNoPage;
    --size_;
  }

  PageId front() const override { return oldest_of_rank(buckets_.begin()); }

  PageId front_not_demoted() const override {
    // Demoted ranks are below every priority (Page::rank).
    return oldest_of_rank(
        buckets_.lower_bound(int64_t{std::numeric_limits<int32_t>::min()} * kAgeClasses));
  }

  uint64_t size() const override { return size_; }

  std::vector<PageId> pages_in_order() const override {
    std::vector<PageId> out;
    for (const auto& [rank, bucket] : buckets_) {
      for (PageId id = bucket.head; id != kNoPage; id = at(id).next) out.push_back(id);
    }
    return out;
  }

  // Buckets: (rank, age class) ascending, then least recently used first.
  std::string check_order() const override {
    const std::vector<PageId> ids = pages_in_order();
    for (size_t k = 1; k < ids.size(); ++k) {
      const Page& prev = at(ids[k - 1]);
      const Page& p = at(ids[k]);
      if (std::tuple(rank_of(prev), prev.age_class, prev.lru_tick) >=
          std::tuple(rank_of(p), p.age_class, p.lru_tick))
        return "queue order broken at page " + std::to_string(ids[k].value);
    }
    return "";
  }

 private:
  struct Bucket {
    PageId head;
    PageId tail;
  };
  using Buckets = std::map<int64_t, Bucket>;
  int64_t rank_of(const Page& p) const { return queue_rank(p, kind_); }
  int64_t key(const Page& p) const { return rank_of(p) * kAgeClasses + p.age_class; }
  Page& at(PageId id) const { return (*pages_)[id.value]; }

  // The longest weighted wait among the heads of the buckets of `it`'s rank.
  PageId oldest_of_rank(Buckets::const_iterator it) const {
    if (it == buckets_.end()) return kNoPage;
    const int64_t rank = rank_of(at(it->second.head));
    PageId best = it->second.head;
    for (++it; it != buckets_.end() && rank_of(at(it->second.head)) == rank; ++it) {
      if (at(it->second.head).weighted_age(*clock_) > at(best).weighted_age(*clock_))
        best = it->second.head;
    }
    return best;
  }

  PageTable* pages_;
  QueueKind kind_;
  const uint64_t* clock_;
  Buckets buckets_;  // by key()
  uint64_t size_ = 0;
};

class RankedLruPolicy final : public EvictionPolicy {
 public:
  RankedLruPolicy(std::string name, bool demotion, bool prices)
      : name_(std::move(name)), demotion_(demotion), prices_(prices) {}
  std::string name() const override { return name_; }
  bool uses_demotion() const override { return demotion_; }
  bool uses_prices() const override { return prices_; }
  std::unique_ptr<EvictionQueue> make_queue(PageTable* pages, QueueKind kind,
                                            const uint64_t* clock) const override {
    return std::make_unique<RankedLruQueue>(pages, kind, clock);
  }
  bool evicted_before(const Page& a, const Page& b, uint64_t now) const override {
    // Two queue fronts: each is ranked as its own queue ranks it.
    const int64_t ra = queue_rank(a, a.queue), rb = queue_rank(b, b.queue);
    if (ra != rb) return ra < rb;
    return a.weighted_age(now) > b.weighted_age(now);
  }

 private:
  std::string name_;
  bool demotion_;
  bool prices_;
};

}  // namespace

std::vector<std::unique_ptr<EvictionPolicy>> shipped_eviction_policies() {
  std::vector<std::unique_ptr<EvictionPolicy>> out;
  out.push_back(std::make_unique<RankedLruPolicy>("priced", true, true));
  out.push_back(std::make_unique<RankedLruPolicy>("snapshot-aware", true, false));
  out.push_back(std::make_unique<RankedLruPolicy>("lru", false, false));
  return out;
}

}  // namespace hybridkv::storage
