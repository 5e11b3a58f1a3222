// Prompt keys hashed ahead (KvCacheManager::hash_prompt, issue 35 item 4): a scheduler hashes a
// prompt when it arrives and hands the keys to create_kv_cache, so that neither the match nor the
// prompt's commits hash on the step. The tree must end up exactly as if it had hashed itself
// (the same nodes, the same reuse, the same bytes), and keys of anything but the prompt they
// are handed with are refused with nothing changed: a wrong key would give a request another
// prompt's KV.
#include <gtest/gtest.h>

#include "lifecycle_fixture.h"
#include "util/xxh3.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hybridkv {
namespace {

// Prompts are fingerprinted with AVX2 where the CPU has it: the value is XXH3's, whatever the
// unit, at every length (XXH3 takes other paths below 16, 128 and 240 bytes and per stripe).
TEST(PromptFingerprint, IsXxh3OnEveryPathAndLength) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> bytes(340 * 1024 + 7);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  for (const size_t n :
       {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{127}, size_t{128}, size_t{239},
        size_t{240}, size_t{241}, size_t{1023}, size_t{1024}, size_t{65537}, bytes.size()}) {
    for (const size_t offset : {size_t{0}, size_t{3}}) {
      if (offset + n > bytes.size()) continue;
      EXPECT_EQ(util::xxh3_64(bytes.data() + offset, n), XXH3_64bits(bytes.data() + offset, n))
          << n << " bytes at offset " << offset;
    }
  }
}

using testing::advance;
using testing::LifecycleModel;
using testing::make_manager;
using testing::random_tokens;
using testing::Request;

// A request created with (or without) keys hashed ahead.
Request open(KvCacheManager& m, const std::vector<int32_t>& tokens, size_t prompt, bool ahead,
             ReuseScope scope = {}, std::vector<MultimodalItem> items = {}) {
  CacheOptions o;
  o.scope = scope;
  o.input_tokens.assign(tokens.begin(), tokens.begin() + static_cast<int64_t>(prompt));
  o.multimodal = items;
  if (ahead) o.prompt_keys = m.hash_prompt(scope, o.input_tokens, items);
  Request r;
  Result<std::unique_ptr<KvCache>> cache = m.create_kv_cache(o);
  EXPECT_TRUE(cache.is_ok()) << cache.status().to_string();
  if (!cache.is_ok()) return r;
  r.cache = std::move(cache).value();
  r.fake.scope = scope;
  r.fake.tokens = {tokens};
  testing::FakeEngine::adopt_reuse(*r.cache, r.fake);
  return r;
}

// Two managers fed the same requests, one hashing ahead, one not: every request reuses the
// same tokens, every probe along the prompts answers the same, and the bytes check out.
TEST(PromptKeys, HashedAheadTheTreeIsTheOneHashingHereBuilds) {
  std::mt19937_64 rng(77);
  // A conversation: each prompt repeats the last one and adds 64 tokens; an image at token 40.
  std::vector<std::vector<int32_t>> prompts = {random_tokens(rng, 200)};
  for (int i = 1; i < 6; ++i) {
    prompts.push_back(prompts.back());
    const std::vector<int32_t> more = random_tokens(rng, 64);
    prompts.back().insert(prompts.back().end(), more.begin(), more.end());
  }
  std::vector<MultimodalItem> items = {{40, {}}};
  items[0].digest[0] = 9;
  auto plain = make_manager(LifecycleModel{});
  auto keyed = make_manager(LifecycleModel{});
  testing::FakeEngine plain_engine(*plain), keyed_engine(*keyed);
  uint64_t reused = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t n = (prompts[i].size() - 8) / 16 * 16;  // computed and committed: whole blocks
    Request a = open(*plain, prompts[i], prompts[i].size(), false, {}, items);
    Request b = open(*keyed, prompts[i], prompts[i].size(), true, {}, items);
    EXPECT_EQ(a.cache->reuse_match().reused_tokens, b.cache->reuse_match().reused_tokens) << i;
    reused += b.cache->reuse_match().reused_tokens;
    for (auto [m, engine, r] :
         {std::tuple{plain.get(), &plain_engine, &a}, std::tuple{keyed.get(), &keyed_engine, &b}}) {
      ASSERT_OK(r->cache->resume({}));
      ASSERT_OK(engine->verify(*r->cache, r->fake));
      ASSERT_OK(advance(*engine, *r, n));
      ASSERT_OK(testing::commit_computed(*r));
      ASSERT_OK(r->cache->close());
      EXPECT_EQ(testing::check_invariants(*m), "");
    }
  }
  EXPECT_GT(reused, 5u * 192);  // every turn after the first reuses the one before it
  for (const auto& p : prompts) {
    for (size_t len : {size_t{100}, size_t{170}, p.size()}) {
      const std::span<const int32_t> prefix(p.data(), len);
      EXPECT_EQ(plain->probe_reuse({}, prefix, items).reused_tokens,
                keyed->probe_reuse({}, prefix, items).reused_tokens)
          << len;
    }
    // Without the image the keys differ from block 2 on: no reuse past it, on either.
    EXPECT_EQ(keyed->probe_reuse({}, p).reused_tokens, plain->probe_reuse({}, p).reused_tokens);
  }
}

TEST(PromptKeys, KeysOfAnythingButTheirPromptAreRefusedAndNothingChanges) {
  std::mt19937_64 rng(78);
  auto m = make_manager(LifecycleModel{});
  const std::vector<int32_t> tokens = random_tokens(rng, 200);
  std::vector<int32_t> other = tokens;
  other[150] ^= 1;
  const std::shared_ptr<const PromptKeys> keys = m->hash_prompt({}, tokens);
  EXPECT_EQ(keys->blocks(), 200u / 16);
  EXPECT_EQ(keys->tokens(), 200u);
  auto refused = [&](CacheOptions o, const std::string& message) {
    o.prompt_keys = keys;
    const Result<std::unique_ptr<KvCache>> c = m->create_kv_cache(o);
    ASSERT_FALSE(c.is_ok());
    EXPECT_NE(c.status().message().find(message), std::string::npos) << c.status().to_string();
  };
  CacheOptions o;
  o.input_tokens = other;  // one token differs
  refused(o, "prompt_keys: computed for another prompt (200 tokens; this one has 200)");
  o.input_tokens.assign(tokens.begin(), tokens.begin() + 180);
  refused(o, "another prompt (200 tokens; this one has 180)");
  o.input_tokens = tokens;
  o.scope.salt = 5;
  refused(o, "prompt_keys: computed for another reuse scope");
  o.scope = {};
  o.multimodal = {{16, {}}};
  refused(o, "another prompt");
  LifecycleModel wider;
  wider.tokens_per_block = 32;
  auto m32 = make_manager(wider);
  CacheOptions fine;
  fine.input_tokens = tokens;
  fine.prompt_keys = keys;
  const Result<std::unique_ptr<KvCache>> c = m32->create_kv_cache(fine);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("tokens_per_block 16"), std::string::npos)
      << c.status().to_string();
  EXPECT_EQ(testing::check_invariants(*m), "");
  EXPECT_EQ(m->storage_stats().live_caches, 0u);
  // The right prompt is taken, and its cache keeps the keys alive past the caller's copy.
  std::shared_ptr<const PromptKeys> mine = m->hash_prompt({}, tokens);
  fine.prompt_keys = std::move(mine);
  auto cache = std::move(m->create_kv_cache(fine)).value();
  fine.prompt_keys.reset();
  testing::FakeEngine engine(*m);
  Request r;
  r.cache = std::move(cache);
  r.fake.tokens = {tokens};
  ASSERT_OK(r.cache->resume({}));
  ASSERT_OK(advance(engine, r, 192));
  ASSERT_OK(testing::commit_computed(r));
  EXPECT_EQ(m->probe_reuse({}, tokens).reused_tokens, 192u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

}  // namespace
}  // namespace hybridkv
