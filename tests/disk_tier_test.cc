// The DISK tier: pages cascade GPU -> HOST -> DISK under pressure and come back bit for bit;
// a bad directory is refused at creation; a failed write is never read back as valid. Runs on
// the host backend (and on CUDA in its `gpu` twin).
#include <gtest/gtest.h>

#include <random>

#include "hybridkv/manager.h"
#include "hybridkv/testing/fault_env.h"
#include "hybridkv/units.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

using testing::LifecycleModel;
using testing::Request;

LifecycleModel disk_model(const std::string& dir) {
  LifecycleModel m;
  m.host_quota = 512ull << 10;
  m.disk_quota = 8ull << 20;
  m.disk_path = dir;
  return m;
}

uint64_t used_slots(const KvCacheManager& m, TierKind tier) {
  const StorageStats stats = m.storage_stats();
  uint64_t used = 0;
  for (const TierStorage& t : stats.tiers) {
    if (t.tier != tier) continue;
    for (const PoolGroupStorage& pg : t.pool_groups) used += pg.total_slots - pg.free_slots;
  }
  return used;
}

// Suspended requests until some of their pages sit on the disk.
std::vector<Request> fill_down_to_disk(KvCacheManager& m, testing::FakeEngine& engine,
                                       std::mt19937_64& rng) {
  std::vector<Request> requests;
  for (int i = 0; i < 40 && used_slots(m, TierKind::kDisk) == 0; ++i) {
    requests.push_back(testing::make_request(m, testing::random_tokens(rng, 400), 300));
    Request& r = requests.back();
    EXPECT_OK(r.cache->resume({}));
    EXPECT_OK(testing::advance(engine, r, 300));
    EXPECT_OK(r.cache->suspend());
  }
  return requests;
}

TEST(DiskTier, SuspendedRequestsCascadeToDiskAndComeBackIntact) {
  testing::TempDir dir;
  auto m = testing::make_manager(disk_model(dir.path));
  ASSERT_NE(m, nullptr);
  testing::FakeEngine engine(*m);
  engine.set_staged_access(true);  // the path the CUDA backend takes, on every backend
  std::mt19937_64 rng(7);
  std::vector<Request> requests = fill_down_to_disk(*m, engine, rng);
  ASSERT_GT(used_slots(*m, TierKind::kDisk), 0u) << "nothing reached the DISK tier";
  // Each comes back to the GPU (the others making room by cascading further down) intact.
  for (Request& r : requests) {
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(testing::advance(engine, r, 320));
    ASSERT_OK(r.cache->suspend());
  }
  for (Request& r : requests) {
    ASSERT_OK(r.cache->resume({}));
    ASSERT_OK(engine.verify(*r.cache, r.fake));
    ASSERT_OK(r.cache->close());
  }
  EXPECT_OK(m->copy_status());
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST(DiskTier, AFailedWriteIsNeverReadAsValid) {
  testing::TempDir dir;
  auto env = std::make_shared<testing::FaultInjectionEnv>();
  auto m = testing::make_manager(disk_model(dir.path), testing::test_backend(env));
  ASSERT_NE(m, nullptr);
  env->set_disk_fault(true);
  testing::FakeEngine engine(*m);
  std::mt19937_64 rng(8);
  std::vector<Request> requests = fill_down_to_disk(*m, engine, rng);
  ASSERT_GT(used_slots(*m, TierKind::kDisk), 0u);
  int corrupt = 0;
  for (Request& r : requests) {
    ASSERT_OK(r.cache->resume({}));
    if (!engine.verify(*r.cache, r.fake).is_ok()) ++corrupt;
    ASSERT_OK(r.cache->suspend());
  }
  // The pages that went through a failed write come back as 0xff, never as stale bytes that
  // might pass, and the manager says which copy failed.
  EXPECT_GT(corrupt, 0);
  const Status s = m->copy_status();
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("writing pool group"), std::string::npos) << s.to_string();
}

TEST(DiskTier, BadDirectoriesAreRefusedAtCreation) {
  testing::TempDir dir;
  LifecycleModel m = disk_model(dir.path + "/missing");
  Result<std::unique_ptr<KvCacheManager>> missing =
      KvCacheManager::create(testing::lifecycle_config(m), testing::test_backend());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos)
      << missing.status().to_string();

  m = disk_model("/proc/self/status");  // a file, not a directory
  Result<std::unique_ptr<KvCacheManager>> file =
      KvCacheManager::create(testing::lifecycle_config(m), testing::test_backend());
  ASSERT_FALSE(file.is_ok());
  EXPECT_NE(file.status().message().find("/proc/self/status"), std::string::npos);

  m = disk_model(dir.path);
  m.disk_quota = 1ull << 44;  // 16 TiB: more than any test machine's free space
  Result<std::unique_ptr<KvCacheManager>> full =
      KvCacheManager::create(testing::lifecycle_config(m), testing::test_backend());
  ASSERT_FALSE(full.is_ok());
  EXPECT_NE(full.status().message().find("free; the tier needs"), std::string::npos)
      << full.status().to_string();
}

}  // namespace
}  // namespace hybridkv
