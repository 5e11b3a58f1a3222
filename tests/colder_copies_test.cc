// Kept copies (ManagerConfig::policies.keep_colder_copies), storage on its own with real bytes
// (host backend): a tree page brought up from the host leaves its bytes there, and evicting it
// again goes back to them without a transfer; copies are the host's first victims and go with their
// page.
#include <gtest/gtest.h>

#include <string>

#include <cstring>
#include <memory>
#include <vector>

#include "memory/backend.h"
#include "storage/room.h"
#include "storage/storage.h"

namespace hybridkv::storage {
namespace {

// One full-attention layer, 8 KiB slots: GPU 64 KiB = 8 slots, HOST 32 KiB = 4 slots.
StoragePlan plan_with_host(bool keep_copies, const std::string& offload = "selective") {
  ManagerConfig c;
  c.tokens_per_block = 16;
  c.policies.keep_colder_copies = keep_copies;
  c.policies.offload = offload;
  AttentionLayerConfig a;
  a.id = 0;
  a.buffers = {{"key", 4096, {}, {}}, {"value", 4096, {}, {}}};
  c.attention_layers.push_back(a);
  c.tiers = {{TierKind::kGpu, 64ull << 10, ""}, {TierKind::kHost, 32ull << 10, ""}};
  return *StoragePlan::build(c);
}

struct Recorder : PageOwner {
  std::vector<OwnerTag> dropped;
  void page_dropping(PageId, OwnerTag owner, CacheGroupId) override { dropped.push_back(owner); }
  void pages_updated(std::span<const PageNotice>) override {}
};

class ColderCopies : public ::testing::Test {
 protected:
  void make(bool keep_copies = true, const std::string& offload = "selective") {
    plan_ = std::make_unique<StoragePlan>(plan_with_host(keep_copies, offload));
    backend_ = std::move(memory::make_backend({BackendKind::kHost})).value();
    ASSERT_TRUE(backend_->allocate(*plan_).is_ok());
    storage_ = std::make_unique<Storage>(*plan_, backend_.get());
    slot_bytes_ = plan_->pool_group(pg_).pools[0].slot_bytes;
  }
  std::byte* bytes_of(PageId id) {
    const Page& p = storage_->page(id);
    return backend_->pool_base(p.tier, pg_, 0, 0) + p.slot.value * slot_bytes_;
  }
  // Fills the GPU with tree pages (owner = allocation order), each slot filled with its tag + 1.
  std::vector<PageId> fill_gpu() {
    std::vector<PageId> ids;
    while (storage_->counts(kGpuTier, pg_).free > 0) {
      ids.push_back(storage_->allocate(CacheGroupId(0), kGpuTier));
      storage_->set_owner(ids.back(), static_cast<OwnerTag>(ids.size() - 1));
      std::memset(bytes_of(ids.back()), static_cast<int>(ids.size()), slot_bytes_);
    }
    return ids;
  }
  void settle() { backend_->wait(storage_->flush()); }
  // fill_gpu, then tags 0 and 1 go down to the host and come back up, leaving their copies
  // there.
  std::vector<PageId> fill_gpu_with_two_host_copies() {
    const std::vector<PageId> ids = fill_gpu();
    make_room(*storage_, kGpuTier, pg_, 2, recorder_);
    storage_->move(ids[0], kGpuTier);
    storage_->move(ids[1], kGpuTier);
    settle();
    return ids;
  }
  // The page holds the bytes fill_gpu wrote for tag `tag`, at both ends of its slot.
  void expect_bytes(PageId id, size_t tag) {
    const std::byte* at = bytes_of(id);
    EXPECT_EQ(at[0], static_cast<std::byte>(tag + 1)) << "page of tag " << tag;
    EXPECT_EQ(at[slot_bytes_ - 1], static_cast<std::byte>(tag + 1)) << "page of tag " << tag;
  }
  uint64_t host_used() const {
    const Storage::SlotCounts c = storage_->counts(kHost, pg_);
    return c.total - c.free;
  }

  static constexpr TierIndex kHost{1};
  std::unique_ptr<StoragePlan> plan_;
  std::unique_ptr<memory::MemoryBackend> backend_;
  std::unique_ptr<Storage> storage_;
  Recorder recorder_;
  const PoolGroupId pg_{0};
  uint64_t slot_bytes_ = 0;
};

TEST_F(ColderCopies, TheNextEvictionGoesBackToTheCopyWithoutATransfer) {
  make();
  const std::vector<PageId> ids = fill_gpu();
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);  // tag 0 goes down: one transfer
  settle();
  ASSERT_EQ(storage_->page(ids[0]).tier, TierKind::kHost);
  const SlotId host_slot = storage_->page(ids[0]).slot;
  storage_->move(ids[0], kGpuTier);  // and comes back up: the host keeps its bytes
  settle();
  const PageId copy = storage_->page(ids[0]).copy_below;
  ASSERT_NE(copy, kNoPage);
  EXPECT_EQ(storage_->page(copy).slot, host_slot);
  EXPECT_TRUE(storage_->page(copy).demoted);
  EXPECT_EQ(host_used(), 1u);
  EXPECT_EQ(storage_->stats().bytes_copies_kept, slot_bytes_);
  expect_bytes(ids[0], 0);
  EXPECT_EQ(storage_->check(), "");

  storage_->set_priority(ids[0], 0);                  // the GPU's next victim
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);  // back to the copy
  settle();
  const Page& p = storage_->page(ids[0]);
  EXPECT_EQ(p.tier, TierKind::kHost);
  EXPECT_EQ(p.slot, host_slot);
  EXPECT_EQ(p.copy_below, kNoPage);
  EXPECT_FALSE(storage_->page(copy).live);
  EXPECT_EQ(storage_->stats().pages_offloaded, 1u);  // only the first trip down
  EXPECT_EQ(storage_->stats().pages_returned_to_copy, 1u);
  EXPECT_EQ(storage_->stats().bytes_returned_to_copy, slot_bytes_);
  EXPECT_EQ(storage_->stats().tiers[1].returned_to_copy_bytes, slot_bytes_);
  EXPECT_EQ(storage_->counts(kGpuTier, pg_).free, 1u);
  EXPECT_EQ(host_used(), 1u);
  expect_bytes(ids[0], 0);
  EXPECT_EQ(storage_->check(), "");
}

TEST_F(ColderCopies, CopiesAreTheColderTiersFirstVictimsAndGoSilently) {
  make();
  const std::vector<PageId> ids = fill_gpu();
  make_room(*storage_, kGpuTier, pg_, 2, recorder_);  // tags 0 and 1 go down ...
  storage_->move(ids[0], kGpuTier);                   // ... and come back, leaving two copies
  storage_->move(ids[1], kGpuTier);
  settle();
  ASSERT_EQ(host_used(), 2u);
  // Four more go down to a host of four slots: two take the free slots, two take the copies'
  // (no page whose bytes exist only on the host is dropped, and nobody is told).
  make_room(*storage_, kGpuTier, pg_, 4, recorder_);
  settle();
  for (size_t k = 2; k < 6; ++k) {
    EXPECT_EQ(storage_->page(ids[k]).tier, TierKind::kHost) << k;
    expect_bytes(ids[k], k);
  }
  EXPECT_EQ(storage_->page(ids[0]).copy_below, kNoPage);
  EXPECT_EQ(storage_->page(ids[1]).copy_below, kNoPage);
  EXPECT_TRUE(recorder_.dropped.empty());
  EXPECT_EQ(storage_->stats().pages_dropped, 0u);
  EXPECT_EQ(host_used(), 4u);
  EXPECT_EQ(storage_->check(), "");
}

TEST_F(ColderCopies, ACopyGoesWhenItsPageStopsBeingATreePageOrIsDropped) {
  make();
  const std::vector<PageId> ids = fill_gpu_with_two_host_copies();
  ASSERT_EQ(host_used(), 2u);
  // Tag 0: a cache holds it and the tree lets it go: its bytes may change from now on.
  storage_->add_ref(ids[0], Ref::kActive);
  storage_->clear_owner(ids[0]);
  EXPECT_EQ(storage_->page(ids[0]).copy_below, kNoPage);
  EXPECT_EQ(host_used(), 1u);
  EXPECT_EQ(storage_->check(), "");
  // Tag 1: demoted (worth nothing), so eviction drops it rather than moving it: its copy goes.
  storage_->set_demoted(ids[1], true);
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);
  EXPECT_FALSE(storage_->page(ids[1]).live);
  EXPECT_EQ(recorder_.dropped, (std::vector<OwnerTag>{1}));
  EXPECT_EQ(host_used(), 0u);
  EXPECT_EQ(storage_->stats().pages_returned_to_copy, 0u);
  EXPECT_EQ(storage_->check(), "");
}

// Offload policy "room" (issue 35 item 1: no snapshot dropped while memory is not short): a
// demoted page goes back to its copy while the host has a free slot, and is dropped (its copy
// with it) once the host is full.
TEST_F(ColderCopies, UnderRoomADemotedPageKeepsItsCopyUntilTheHostIsFull) {
  make(/*keep_copies=*/true, "room");
  const std::vector<PageId> ids = fill_gpu_with_two_host_copies();
  ASSERT_EQ(host_used(), 2u);
  storage_->set_demoted(ids[0], true);
  storage_->set_demoted(ids[1], true);
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);  // the host has room: back to its copy
  EXPECT_TRUE(recorder_.dropped.empty());
  EXPECT_EQ(storage_->stats().pages_returned_to_copy, 1u);
  // The host fills up: the other demoted page is dropped, and its copy goes with it.
  std::vector<PageId> on_host;
  while (storage_->counts(kHost, pg_).free > 0) {
    on_host.push_back(storage_->allocate(CacheGroupId(0), kHost));
    storage_->set_owner(on_host.back(), static_cast<OwnerTag>(100 + on_host.size()));
  }
  const uint64_t full = host_used();
  const PageId other = storage_->page(ids[0]).tier == TierKind::kGpu ? ids[0] : ids[1];
  ASSERT_EQ(storage_->page(other).tier, TierKind::kGpu);
  make_room(*storage_, kGpuTier, pg_, 2, recorder_);  // one slot is free already: one eviction
  EXPECT_FALSE(storage_->page(other).live);
  EXPECT_EQ(recorder_.dropped.size(), 1u);
  EXPECT_EQ(host_used(), full - 1);
  EXPECT_EQ(storage_->check(), "");
}

TEST_F(ColderCopies, NoCopyForAPageOfNoTreeOrWhenTurnedOff) {
  make();
  const PageId held = storage_->allocate(CacheGroupId(0), kGpuTier);
  storage_->add_ref(held, Ref::kSuspended);  // a suspended request's own page: it may change
  (void)fill_gpu();
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);
  ASSERT_EQ(storage_->page(held).tier, TierKind::kHost);
  storage_->move(held, kGpuTier);
  EXPECT_EQ(storage_->page(held).copy_below, kNoPage);
  EXPECT_EQ(host_used(), 0u);
  EXPECT_EQ(storage_->check(), "");

  make(/*keep_copies=*/false);
  const std::vector<PageId> ids = fill_gpu();
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);
  storage_->move(ids[0], kGpuTier);
  EXPECT_EQ(storage_->page(ids[0]).copy_below, kNoPage);
  EXPECT_EQ(host_used(), 0u);
  EXPECT_EQ(storage_->stats().bytes_copies_kept, 0u);
  EXPECT_EQ(storage_->check(), "");
}

}  // namespace
}  // namespace hybridkv::storage
