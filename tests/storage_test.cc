// storage/ on its own, without a manager: reference counts and states, eviction order
// (priority, then least recently used), the tier cascade, and storage's own checker.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hybridkv/testing/fault_env.h"
#include "memory/backend.h"
#include "storage/room.h"
#include "storage/storage.h"

namespace hybridkv::storage {
namespace {

// One full-attention layer, 8 KiB slots: GPU 2 MiB = 256 slots, HOST 32 KiB = 4 slots.
StoragePlan small_plan(bool with_host) {
  ManagerConfig c;
  c.tokens_per_block = 16;
  AttentionLayerConfig a;
  a.id = 0;
  a.buffers = {{"key", 4096, {}, {}}, {"value", 4096, {}, {}}};
  c.attention_layers.push_back(a);
  c.tiers = {{TierKind::kGpu, 2ull << 20, ""}};
  if (with_host) c.tiers.push_back({TierKind::kHost, 32ull << 10, ""});
  return *StoragePlan::build(c);
}

// Records what storage reports about owned pages.
struct Recorder : PageOwner {
  std::vector<OwnerTag> dropped;
  std::vector<OwnerTag> updated;
  void page_dropping(PageId, OwnerTag owner, CacheGroupId) override { dropped.push_back(owner); }
  void pages_updated(std::span<const PageNotice> notices) override {
    for (const PageNotice& n : notices) updated.push_back(n.owner);
  }
};

class StorageTest : public ::testing::Test {
 protected:
  void make(bool with_host) {
    plan_ = std::make_unique<StoragePlan>(small_plan(with_host));
    backend_ = std::move(memory::make_backend({BackendKind::kNone})).value();
    ASSERT_TRUE(backend_->allocate(*plan_).is_ok());
    storage_ = std::make_unique<Storage>(*plan_, backend_.get());
  }
  uint64_t gpu_slots() const { return storage_->counts(kGpuTier, pg_).total; }
  uint64_t free_gpu() const { return storage_->counts(kGpuTier, pg_).free; }
  // Fills every free GPU slot with pages owned by tag = allocation order.
  std::vector<PageId> fill_owned() {
    std::vector<PageId> ids;
    while (free_gpu() > 0) {
      ids.push_back(storage_->allocate(group_, kGpuTier));
      storage_->set_owner(ids.back(), static_cast<OwnerTag>(ids.size() - 1));
    }
    return ids;
  }

  std::unique_ptr<StoragePlan> plan_;
  std::unique_ptr<memory::MemoryBackend> backend_;
  std::unique_ptr<Storage> storage_;
  Recorder recorder_;
  const CacheGroupId group_{0};
  const PoolGroupId pg_{0};
};

TEST_F(StorageTest, StateFollowsReferencesAndOwner) {
  make(false);
  const PageId p = storage_->allocate(group_, kGpuTier);
  storage_->add_ref(p, Ref::kActive);
  EXPECT_EQ(storage_->page(p).state(), PageState::kLocked);
  storage_->convert_ref(p, Ref::kActive, Ref::kSuspended);
  EXPECT_EQ(storage_->page(p).state(), PageState::kHeld);
  EXPECT_EQ(storage_->counts(kGpuTier, pg_).evictable, 1u);
  storage_->set_owner(p, 7);
  storage_->drop_ref(p, Ref::kSuspended);
  EXPECT_EQ(storage_->page(p).state(), PageState::kDroppable);
  EXPECT_EQ(storage_->check(), "");
  // The owner lets go and nobody refers to it: released, its slot free again.
  storage_->clear_owner(p);
  EXPECT_FALSE(storage_->page(p).live);
  EXPECT_EQ(free_gpu(), gpu_slots());
  EXPECT_EQ(storage_->check(), "");
}

TEST_F(StorageTest, EvictionTakesLowestPriorityFirstThenLeastRecentlyUsed) {
  make(false);
  const std::vector<PageId> ids = fill_owned();
  ASSERT_EQ(ids.size(), gpu_slots());
  // Priorities: page 5 lowest (10), pages 2 and 9 next (20; 9 became evictable after 2 by
  // being re-queued through the priority change), everything else default (35).
  storage_->set_priority(ids[9], 20);
  storage_->set_priority(ids[2], 20);
  storage_->set_priority(ids[5], 10);
  EXPECT_EQ(storage_->check(), "");
  recorder_.dropped.clear();
  make_room(*storage_, kGpuTier, pg_, 5, recorder_);
  // 5 (priority 10), 9 then 2 (priority 20, in the order they joined that bucket), then the
  // default-priority pages oldest first: 0, 1.
  EXPECT_EQ(recorder_.dropped, (std::vector<OwnerTag>{5, 9, 2, 0, 1}));
  EXPECT_EQ(free_gpu(), 5u);
  EXPECT_EQ(storage_->check(), "");
}

// The eviction loop runs outside storage (storage/room.h): an owner told of a drop finds
// storage consistent (no storage call is running), may let other pages go itself (as the prefix
// index drops orphaned KV), and the next eviction is planned against what it left: room for 3
// takes one victim, the owner's two pages make the rest.
TEST_F(StorageTest, AnOwnerToldOfADropFindsStorageAtRestAndItsOwnDropsCount) {
  make(false);
  const std::vector<PageId> ids = fill_owned();
  struct LetsTwoGo : PageOwner {
    Storage* storage = nullptr;
    std::vector<PageId> others;
    std::vector<OwnerTag> dropped;
    std::string check_at_drop;
    void page_dropping(PageId, OwnerTag owner, CacheGroupId) override {
      dropped.push_back(owner);
      check_at_drop += storage->check();
      for (PageId p : others) storage->drop_owned(p);
      others.clear();
    }
    void pages_updated(std::span<const PageNotice>) override {}
  } owner;
  owner.storage = storage_.get();
  owner.others = {ids[7], ids[8]};
  make_room(*storage_, kGpuTier, pg_, 3, owner);
  EXPECT_EQ(owner.dropped, std::vector<OwnerTag>{0});
  EXPECT_EQ(owner.check_at_drop, "");
  EXPECT_EQ(free_gpu(), 3u);
  EXPECT_EQ(storage_->stats().pages_dropped, 3u);
  EXPECT_EQ(storage_->check(), "");
}

// Storage plans an eviction without changing anything.
TEST_F(StorageTest, PlanningAnEvictionChangesNothing) {
  make(true);
  for (int i = 0; i < 2; ++i)
    storage_->add_ref(storage_->allocate(group_, kGpuTier), Ref::kSuspended);
  fill_owned();
  const std::string before = storage_->snapshot();
  const std::optional<Eviction> e = storage_->next_eviction(kGpuTier, pg_, 1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->action, Eviction::Action::kMoveDown);  // the oldest page is HELD: it moves down
  EXPECT_EQ(storage_->snapshot(), before);
  EXPECT_FALSE(storage_->next_eviction(kGpuTier, pg_, 0).has_value());
}

TEST_F(StorageTest, HeldPagesCascadeToTheHostAndDroppablePagesDropOnTheLastTier) {
  make(true);
  // Four HELD pages (oldest first) and the rest DROPPABLE, all on the GPU.
  std::vector<PageId> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(storage_->allocate(group_, kGpuTier));
    storage_->add_ref(held.back(), Ref::kSuspended);
  }
  const std::vector<PageId> owned = fill_owned();
  const TierIndex host(1);
  ASSERT_EQ(storage_->counts(host, pg_).total, 4u);
  // Making room for 6: the four HELD pages are oldest, so they go first, down to the host
  // (they are never dropped); then two DROPPABLE pages move down only while the host has room:
  // it is full, so they are dropped.
  make_room(*storage_, kGpuTier, pg_, 6, recorder_);
  for (PageId p : held) EXPECT_EQ(storage_->page(p).tier, TierKind::kHost);
  EXPECT_EQ(storage_->stats().pages_offloaded, 4u);
  EXPECT_EQ(recorder_.dropped, (std::vector<OwnerTag>{0, 1}));
  EXPECT_EQ(free_gpu(), 6u);
  // A HELD page on the host can come back to the GPU.
  storage_->move(held[0], kGpuTier);
  EXPECT_EQ(storage_->page(held[0]).tier, TierKind::kGpu);
  EXPECT_EQ(storage_->stats().pages_onboarded, 1u);
  EXPECT_EQ(storage_->check(), "");
}

// A page written into a slot that a copy of the batch being built reads waits for that batch;
// a later batch that does not read the slot does not hold up its next page.
TEST_F(StorageTest, APageInASlotTheBatchReadsWaitsForTheBatch) {
  make(true);
  const PageId down = storage_->allocate(group_, kGpuTier);
  storage_->add_ref(down, Ref::kSuspended);
  const SlotId read = storage_->page(down).slot;
  (void)storage_->flush();
  storage_->move(down, TierIndex(1));  // the offload reads `read`, which goes back on the stack
  const PageId next = storage_->allocate(group_, kGpuTier);
  ASSERT_EQ(storage_->page(next).slot, read);
  const CopyEvent batch = storage_->flush();
  ASSERT_NE(batch.ticket, 0u);
  EXPECT_EQ(storage_->page(next).ready.ticket, batch.ticket);
  // Released, the slot is free once that batch is done; a later batch that does not read it
  // does not hold up its next page.
  storage_->add_ref(next, Ref::kActive);
  storage_->drop_ref(next, Ref::kActive);
  (void)storage_->flush();
  const PageId again = storage_->allocate(group_, kGpuTier);
  ASSERT_EQ(storage_->page(again).slot, read);
  const PageId other = storage_->allocate(group_, kGpuTier);
  storage_->add_ref(other, Ref::kSuspended);
  storage_->move(other, TierIndex(1));
  const CopyEvent later = storage_->flush();
  ASSERT_GT(later.ticket, batch.ticket);
  EXPECT_EQ(storage_->page(again).ready.ticket, batch.ticket);
}

TEST_F(StorageTest, MaxRoomCountsHeldPagesOnlyWhereAColderTierTakesThem) {
  make(false);
  for (uint64_t i = 0; i < gpu_slots(); ++i) {
    storage_->add_ref(storage_->allocate(group_, kGpuTier), Ref::kSuspended);
  }
  // One tier: HELD pages can never be dropped, so there is no room at all.
  EXPECT_EQ(storage_->max_room(kGpuTier, pg_), 0u);
}

// Rebalancing reads ever_full: a pool group whose free slots were never all needed. Evicting a
// demoted page (worth nothing) does not set it, nor does a reset of the victim count clear it.
TEST_F(StorageTest, EverFullIsSetByTheFirstEvictionOfAPageOfValue) {
  make(false);
  const std::vector<PageId> ids = fill_owned();
  EXPECT_FALSE(storage_->ever_full(kGpuTier, pg_));
  storage_->set_demoted(ids[3], true);
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);  // the demoted page goes first
  EXPECT_EQ(recorder_.dropped, std::vector<OwnerTag>{3});
  EXPECT_FALSE(storage_->ever_full(kGpuTier, pg_));
  EXPECT_EQ(storage_->victims(kGpuTier, pg_), 0u);
  make_room(*storage_, kGpuTier, pg_, 2, recorder_);  // then the least recently used page of value
  EXPECT_EQ(recorder_.dropped, (std::vector<OwnerTag>{3, 0}));
  EXPECT_TRUE(storage_->ever_full(kGpuTier, pg_));
  EXPECT_EQ(storage_->victims(kGpuTier, pg_), 1u);
  storage_->reset_victims(kGpuTier);
  EXPECT_EQ(storage_->victims(kGpuTier, pg_), 0u);
  EXPECT_TRUE(storage_->ever_full(kGpuTier, pg_));
  EXPECT_EQ(storage_->check(), "");
}

// A HELD page's holder resumes into it whatever the tree says of it: the tree's demotion puts a
// DROPPABLE page before every page of value, but not a HELD one, which waits its turn by age
// (a request about to resume had the pages it prefetched taken first, and went on waiting).
TEST_F(StorageTest, ADemotedHeldPageIsNotTakenBeforePagesOfValue) {
  make(true);
  const std::vector<PageId> ids = fill_owned();
  storage_->add_ref(ids[5], Ref::kSuspended);  // HELD, and the newest in its queue
  storage_->set_demoted(ids[5], true);
  storage_->set_demoted(ids[7], true);
  make_room(*storage_, kGpuTier, pg_, 1, recorder_);  // the demoted DROPPABLE page first
  EXPECT_EQ(recorder_.dropped, std::vector<OwnerTag>{7});
  make_room(*storage_, kGpuTier, pg_, 2, recorder_);       // then the least recently used
  EXPECT_NE(storage_->page(ids[0]).tier, TierKind::kGpu);  // copied down (a page of value)
  EXPECT_EQ(storage_->page(ids[5]).tier, TierKind::kGpu);
  EXPECT_EQ(storage_->check(), "");
  // Released by its holder, the page is DROPPABLE and demoted again: it goes first.
  storage_->drop_ref(ids[5], Ref::kSuspended);
  make_room(*storage_, kGpuTier, pg_, 3, recorder_);
  EXPECT_EQ(recorder_.dropped, (std::vector<OwnerTag>{7, 5}));
  EXPECT_EQ(storage_->page(ids[1]).tier, TierKind::kGpu);
  EXPECT_EQ(storage_->check(), "");
}

// Shrinking a pool moves exactly the pages in the retired slots into free ones below; growing
// it again puts the new slots under the free stack.
TEST_F(StorageTest, ShrinkingAPoolMovesOnlyThePagesInRetiredSlots) {
  make(false);
  const std::vector<PageId> ids = fill_owned();  // page k in slot k
  const uint64_t total = gpu_slots();
  for (size_t k = 0; k < 16; ++k) storage_->drop_owned(ids[k]);  // slots 0 .. 15 free
  ASSERT_EQ(free_gpu(), 16u);
  recorder_.updated.clear();
  (void)storage_->resize_pool(kGpuTier, pg_, total - 10);
  storage::deliver_notices(*storage_, recorder_);
  std::vector<OwnerTag> moved;
  for (size_t k = total - 10; k < total; ++k) moved.push_back(static_cast<OwnerTag>(k));
  EXPECT_EQ(recorder_.updated, moved);
  for (size_t k = 16; k < total; ++k) {
    const SlotId slot = storage_->page(ids[k]).slot;
    if (k < total - 10) {
      EXPECT_EQ(slot.value, k) << "page " << k << " stays";
    } else {
      EXPECT_LT(slot.value, 16u) << "page " << k << " moves into a freed slot";
    }
  }
  EXPECT_EQ(free_gpu(), 6u);
  EXPECT_EQ(storage_->check(), "");
  (void)storage_->resize_pool(kGpuTier, pg_, total);
  EXPECT_EQ(free_gpu(), 16u);
  auto slot_of_new_page = [&] {
    const PageId id = storage_->allocate(group_, kGpuTier);
    storage_->set_owner(id, 1000);
    return storage_->page(id).slot.value;
  };
  for (size_t k = 0; k < 6; ++k) EXPECT_LT(slot_of_new_page(), 16u);  // the old free slots first
  EXPECT_EQ(slot_of_new_page(), total - 10);  // then the new ones, lowest first
  EXPECT_EQ(storage_->check(), "");
}

// Issue 36: the none backend's bookkeeping grew with the quota (64 TiB: std::bad_alloc). Slots
// never used cost nothing; they are handed out lowest first after the freed ones, as before.
TEST(StorageHugeQuota, SlotsCostNothingUntilUsed) {
  ManagerConfig c;
  c.tokens_per_block = 16;
  AttentionLayerConfig a;
  a.buffers = {{"key", 512, {}, {}}, {"value", 512, {}, {}}};
  c.attention_layers.push_back(a);
  c.tiers = {{TierKind::kGpu, 1ull << 40, ""},
             {TierKind::kHost, 1ull << 40, ""}};  // 2^30 slots each
  const StoragePlan plan = *StoragePlan::build(c);
  auto backend = std::move(memory::make_backend({BackendKind::kNone})).value();
  ASSERT_TRUE(backend->allocate(plan).is_ok());
  Storage storage(plan, backend.get());
  const uint64_t total = storage.counts(kGpuTier, PoolGroupId(0)).total;
  ASSERT_EQ(total, 1ull << 30);
  std::vector<PageId> ids;
  for (int k = 0; k < 4; ++k) {
    ids.push_back(storage.allocate(CacheGroupId(0), kGpuTier));
    storage.set_owner(ids.back(), static_cast<OwnerTag>(k));
    EXPECT_EQ(storage.page(ids.back()).slot.value, static_cast<uint32_t>(k));
  }
  storage.drop_owned(ids[1]);
  const PageId again = storage.allocate(CacheGroupId(0), kGpuTier);
  storage.set_owner(again, 9);
  EXPECT_EQ(storage.page(again).slot.value, 1u) << "a freed slot is reused before a new one";
  EXPECT_EQ(storage.counts(kGpuTier, PoolGroupId(0)).free, total - 4);
  EXPECT_EQ(storage.check(), "");
}

TEST_F(StorageTest, CheckerFindsAPageWithNoHolder) {
  make(false);
  (void)storage_->allocate(group_, kGpuTier);  // nobody took a reference or ownership
  EXPECT_NE(storage_->check().find("no holder"), std::string::npos) << storage_->check();
}

// Host backend: a page dropped before its offload copy ran has the copy cancelled (the bus
// carries nothing for it); pages that stay get their bytes.
TEST(StorageHostBackend, OffloadsOfPagesDroppedBeforeTheCopyRanAreCancelled) {
  const StoragePlan plan = small_plan(true);  // host: 4 slots
  auto env = std::make_shared<testing::FaultInjectionEnv>();
  std::unique_ptr<memory::MemoryBackend> backend =
      std::move(memory::make_backend({.kind = BackendKind::kHost, .env = env})).value();
  ASSERT_TRUE(backend->allocate(plan).is_ok());
  Storage storage(plan, backend.get());
  Recorder recorder;
  const PoolGroupId pg(0);
  const uint64_t slot_bytes = plan.pool_group(pg).pools[0].slot_bytes;
  std::vector<PageId> ids;
  while (storage.counts(kGpuTier, pg).free > 0) {
    ids.push_back(storage.allocate(CacheGroupId(0), kGpuTier));
    storage.set_owner(ids.back(), static_cast<OwnerTag>(ids.size() - 1));
    std::byte* at = backend->pool_base(TierKind::kGpu, pg, 0, 0) +
                    storage.page(ids.back()).slot.value * slot_bytes;
    std::memset(at, static_cast<int>(ids.size() % 251), slot_bytes);
  }
  env->set_copy_gate(false);                      // hold every copy
  make_room(storage, kGpuTier, pg, 4, recorder);  // pages 0-3 go to the host, copies queued
  (void)storage.flush();
  make_room(storage, kGpuTier, pg, 8, recorder);  // pages 4-7 follow and push 0-3 out: dropped
  (void)storage.flush();
  EXPECT_EQ(recorder.dropped, (std::vector<OwnerTag>{0, 1, 2, 3}));
  EXPECT_EQ(storage.stats().pages_offload_cancelled, 4u);
  EXPECT_EQ(storage.stats().bytes_offload_cancelled, 4 * plan.pool_group(pg).slot_bytes);
  env->set_copy_gate(true);
  backend->wait(CopyEvent{UINT64_MAX});
  for (size_t k = 4; k < 8; ++k) {
    const Page& p = storage.page(ids[k]);
    ASSERT_EQ(p.tier, TierKind::kHost);
    const std::byte* at = backend->pool_base(TierKind::kHost, pg, 0, 0) + p.slot.value * slot_bytes;
    EXPECT_EQ(at[0], static_cast<std::byte>((k + 1) % 251)) << "page " << k;
    EXPECT_EQ(at[slot_bytes - 1], static_cast<std::byte>((k + 1) % 251)) << "page " << k;
  }
  EXPECT_EQ(storage.check(), "");
}

// copy_out: a copy of a page's slot (every pool, in order) into host memory, queued like any
// other copy. The page does not wait for it; whoever takes the slot next does.
TEST(StorageHostBackend, ACopyOutReadsEveryPoolAndTheSlotsNextOwnerWaitsForIt) {
  ManagerConfig c;  // an SSM layer of two buffers of two dtypes: a pool group of two pools
  c.tokens_per_block = 16;
  SsmLayerConfig ssm;
  ssm.id = 0;
  ssm.buffers = {{"ssm_state", 16384, {}, DType::kF32}, {"conv_state", 4096, {}, DType::kBF16}};
  c.ssm_layers.push_back(ssm);
  c.tiers = {{TierKind::kGpu, 2ull << 20, ""}};
  const StoragePlan plan = *StoragePlan::build(c);
  auto env = std::make_shared<testing::FaultInjectionEnv>();
  std::unique_ptr<memory::MemoryBackend> backend =
      std::move(memory::make_backend({.kind = BackendKind::kHost, .env = env})).value();
  ASSERT_TRUE(backend->allocate(plan).is_ok());
  Storage storage(plan, backend.get());
  const PoolGroupId pg(0);
  const std::vector<Pool>& pools = plan.pool_group(pg).pools;
  ASSERT_GE(pools.size(), 2u);
  const PageId page = storage.allocate(CacheGroupId(0), kGpuTier);
  storage.add_ref(page, Ref::kActive);
  const SlotId slot = storage.page(page).slot;
  uint64_t total = 0;
  for (uint32_t k = 0; k < pools.size(); ++k) {
    std::memset(backend->pool_base(TierKind::kGpu, pg, k, 0) + slot.value * pools[k].slot_bytes,
                'a' + static_cast<int>(k), pools[k].slot_bytes);
    total += pools[k].slot_bytes;
  }
  const CopyEvent before = storage.page(page).ready;
  memory::HostBuffer out = backend->host_buffer(total);
  env->set_copy_gate(false);
  storage.copy_out(page, out.get());
  const CopyEvent copied = storage.flush();
  ASSERT_NE(copied.ticket, 0u);
  EXPECT_EQ(storage.page(page).ready.ticket, before.ticket);  // the page itself does not wait
  storage.drop_ref(page, Ref::kActive);                       // released: its slot is free
  const PageId next = storage.allocate(CacheGroupId(0), kGpuTier);
  storage.add_ref(next, Ref::kActive);
  ASSERT_EQ(storage.page(next).slot, slot);
  EXPECT_EQ(storage.page(next).ready.ticket, copied.ticket);  // writes only after the copy
  env->set_copy_gate(true);
  backend->wait(copied);
  uint64_t at = 0;
  for (uint32_t k = 0; k < pools.size(); ++k) {
    const std::byte want{static_cast<unsigned char>('a' + k)};
    EXPECT_EQ(out.get()[at], want) << "pool " << k;
    EXPECT_EQ(out.get()[at + pools[k].slot_bytes - 1], want) << "pool " << k;
    at += pools[k].slot_bytes;
  }
  EXPECT_EQ(storage.check(), "");
}

}  // namespace
}  // namespace hybridkv::storage
