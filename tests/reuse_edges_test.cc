// Reuse at the edges (issue 31): the reference manager's scenarios (TensorRT-LLM's KV cache
// manager v2 tests), translated to this API. There, a request looks up its prompt less the
// last token (the engine passes `input_tokens = prompt[:-1]`); here create_kv_cache and
// probe_reuse take the whole prompt and leave its last token out themselves. So "a lookup of
// the N committed tokens" is a prompt of those N tokens and one more.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "hybridkv/manager.h"
#include "hybridkv/testing/fake_engine.h"
#include "hybridkv/testing/inspect.h"
#include "lifecycle_fixture.h"
#include "test_backend.h"

namespace hybridkv {
namespace {

constexpr uint32_t kTpb = 32;

std::vector<int32_t> tokens_from(uint32_t seed, uint64_t n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % 50000);
  return out;
}

// The prompt whose lookup is `tokens` (one token past them, which is always computed).
std::vector<int32_t> prompt_for(std::span<const int32_t> tokens) {
  std::vector<int32_t> p(tokens.begin(), tokens.end());
  p.push_back(-7);
  return p;
}

AttentionLayerConfig attention(LayerId id, std::optional<uint32_t> window = {},
                               std::optional<uint32_t> sinks = {}) {
  AttentionLayerConfig a;
  a.id = id;
  a.window = window;
  a.sink_tokens = sinks;
  a.buffers = {{"key", 1024, {}, {}}, {"value", 1024, {}, {}}};
  return a;
}

SsmLayerConfig ssm(LayerId id) {
  SsmLayerConfig s;
  s.id = id;
  s.buffers = {{"ssm_state", 4096, {}, DType::kF32}};
  return s;
}

std::unique_ptr<KvCacheManager> manager(ManagerConfig c, uint64_t gpu_bytes = 16ull << 20) {
  c.tokens_per_block = kTpb;
  c.tiers = {{TierKind::kGpu, gpu_bytes, ""}};
  Result<std::unique_ptr<KvCacheManager>> m = KvCacheManager::create(c, testing::test_backend());
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m).value();
}

// A request whose pages the fake engine writes and checks: every step first checks what it
// reads (reused pages included), so a match that restores the wrong page fails there.
struct Request {
  std::unique_ptr<KvCache> cache;
  testing::FakeRequest fake;
};

Request open(KvCacheManager& m, const std::vector<int32_t>& prompt) {
  Request r{std::move(m.create_kv_cache({{}, prompt, 1, {}, {}, {}})).value(), {}};
  r.fake.tokens = {prompt};
  testing::FakeEngine::adopt_reuse(*r.cache, r.fake);
  EXPECT_OK(r.cache->resume({}));
  return r;
}

// One step that computes up to `end` (the engine checks, then writes), then history follows.
void step(testing::FakeEngine& engine, Request& r, uint64_t end) {
  EXPECT_OK(r.cache->resize(end, r.cache->history()));
  EXPECT_OK(engine.step(*r.cache, r.fake, end));
  EXPECT_OK(r.cache->resize(end, end));
}

void commit_to_history(Request& r) {
  const std::span<const int32_t> all(r.fake.tokens[0]);
  const uint64_t c = r.cache->committed_tokens(), h = r.cache->history();
  EXPECT_OK(r.cache->commit(all.subspan(c, h - c)));
}

// A request of `prompt` that computes it in steps ending at each of `commit_ends`, committing
// at each; left ACTIVE.
Request run(KvCacheManager& m, testing::FakeEngine& engine, const std::vector<int32_t>& prompt,
            std::vector<uint64_t> commit_ends) {
  Request r = open(m, prompt);
  for (uint64_t end : commit_ends) {
    step(engine, r, end);
    commit_to_history(r);
  }
  return r;
}

uint64_t reused(const KvCacheManager& m, std::span<const int32_t> lookup) {
  return m.probe_reuse({}, prompt_for(lookup)).reused_tokens;
}

// Item 1: a window layer (32 tokens) and an SSM layer; 48 tokens committed, then a planned
// drop. Until release() the tree is as it was; after close() and release() nothing of that
// endpoint is matched and no window page of it is left in the tree.
TEST(ReuseEdges, APlannedSnapshotDropChangesNothingUntilReleased) {
  ManagerConfig c;
  c.attention_layers = {attention(1, 32)};
  c.ssm_layers = {ssm(0)};
  c.commit_min_snapshot = true;
  c.enable_partial_reuse = true;
  auto m = manager(c);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = tokens_from(1, 48);
  Request a = run(*m, engine, prompt_for(tokens), {48});
  EXPECT_EQ(reused(*m, tokens), 48u);
  EXPECT_EQ(testing::tree_pages(*m).size(), 3u);  // window blocks 0 and 1, the snapshot at 48
  PlannedDrop drop = std::move(a.cache->plan_snapshot_drop()).value();
  EXPECT_EQ(reused(*m, tokens), 48u);
  EXPECT_EQ(testing::tree_pages(*m).size(), 3u);
  {
    Request b = open(*m, prompt_for(tokens));  // the tree as it was: restored and checked
    EXPECT_EQ(b.cache->history(), 48u);
    step(engine, b, 49);
  }
  ASSERT_OK(a.cache->close());
  EXPECT_EQ(reused(*m, tokens), 48u);
  ASSERT_OK(drop.release());
  EXPECT_EQ(reused(*m, tokens), 0u);
  // Window 32 at endpoint 48 needs tokens 17..47: blocks 0 and 1, both dropped with the
  // snapshot.
  EXPECT_EQ(testing::tree_pages(*m).size(), 0u);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// Item 2: attention + SSM, commits at 32 and 48, partial reuse off. A lookup past the commits
// reuses the full block only; a lookup of exactly the 48 committed tokens asks for the
// endpoint itself, whose snapshot exists, and reuses it.
TEST(ReuseEdges, PartialReuseOffStillServesAnExactEndpoint) {
  ManagerConfig c;
  c.attention_layers = {attention(1)};
  c.ssm_layers = {ssm(0)};
  c.commit_min_snapshot = true;
  c.enable_partial_reuse = false;
  auto m = manager(c);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = tokens_from(2, 64);
  const std::span<const int32_t> all(tokens);
  Request a = run(*m, engine, std::vector<int32_t>(tokens.begin(), tokens.begin() + 48), {32, 48});
  EXPECT_EQ(reused(*m, all.first(64)), 32u);
  EXPECT_EQ(reused(*m, all.first(48)), 48u);
  EXPECT_EQ(reused(*m, all.first(40)), 32u);  // inside the tail: a partial block, not reused
  // A request of those 48 tokens starts at 48 and computes its last prompt token into a copy
  // of the tail block; the first request's pages are unchanged.
  Request b = open(*m, prompt_for(all.first(48)));
  EXPECT_EQ(b.cache->reuse_match().reused_tokens, 48u);
  EXPECT_EQ(b.cache->history(), 48u);
  step(engine, b, 49);
  CacheGroupId kv;
  for (const CacheGroup& g : m->plan().cache_groups())
    if (g.kind == GroupKind::kAttention) kv = g.id;
  EXPECT_NE((*b.cache->block_table(kv))[1], (*a.cache->block_table(kv))[1]);
  EXPECT_OK(engine.verify(*a.cache, a.fake));
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// Item 3: two attention layers, one with a 33-token window; partial reuse on,
// commit_min_snapshot, a backoff of one token. A 48-token turn, then a turn that extends it to
// 96 tokens by generating them (pages of generated tokens that leave the window are freed at
// once, so the full block [32, 64) keeps no window page). A probe of the 96 tokens backs off to
// 95, where the window needs token 63 of that block; the longest point whose window is covered
// is 48, through the first turn's partial block [32, 48).
TEST(ReuseEdges, BackoffRechecksTheWindowAtTheFinalEndpoint) {
  ManagerConfig c;
  c.attention_layers = {attention(0), attention(1, 33)};
  c.commit_min_snapshot = true;
  c.enable_partial_reuse = true;
  c.reuse_match_backoff = 1;
  auto m = manager(c);
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> tokens = tokens_from(3, 96);
  const std::span<const int32_t> all(tokens);
  ASSERT_OK(run(*m, engine, prompt_for(all.first(48)), {48}).cache->close());
  {
    Request turn2 = open(*m, std::vector<int32_t>(all.begin(), all.begin() + 49));
    EXPECT_EQ(turn2.cache->reuse_match().reused_tokens, 47u);  // 48, backed off by one
    turn2.fake.tokens[0] = tokens;                             // it generates up to 96
    for (uint64_t h = turn2.cache->history(); h < 96; ++h) step(engine, turn2, h + 1);
    commit_to_history(turn2);
    ASSERT_OK(turn2.cache->close());
  }
  const ReuseMatch probe = m->probe_reuse({}, prompt_for(all));
  EXPECT_EQ(probe.divergence_tokens, 96u);
  EXPECT_EQ(probe.reused_tokens, 48u);
  // The next turn of those 96 tokens restores [0, 48) from block 0 and the first turn's
  // partial block, which the engine checks, and computes on.
  Request turn3 = open(*m, prompt_for(all));
  EXPECT_EQ(turn3.cache->reuse_match().reused_tokens, 48u);
  step(engine, turn3, 97);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

// Item 4: a window of 128 with 32 sink tokens; a batch constraint of four 512-token requests
// sharing a system prompt. A warm request commits its 512 tokens in one commit and closes; then
// each of four requests (the system prompt and its own question) reuses the system prompt's
// full blocks, and all four fit on the GPU together, as the constraint promised.
void expect_window_endpoints_reusable(uint64_t system) {
  SCOPED_TRACE("system prompt " + std::to_string(system));
  constexpr uint64_t kLen = 512, kBatch = 4;
  ManagerConfig c;
  c.attention_layers = {attention(0, 128, 32)};
  c.commit_min_snapshot = true;
  c.enable_partial_reuse = true;
  c.constraints.push_back(BatchShape{std::vector<RequestShape>(kBatch, {kLen, 0}), system});
  auto m = manager(c, 42 * 2048);  // 42 pages, as in the issue
  testing::FakeEngine engine(*m);
  const std::vector<int32_t> shared = tokens_from(4, system);
  auto prompt_of = [&](uint32_t seed) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> own = tokens_from(seed, kLen - system);
    p.insert(p.end(), own.begin(), own.end());
    return p;
  };
  ASSERT_OK(run(*m, engine, prompt_of(10), {kLen}).cache->close());
  std::vector<Request> requests;
  for (uint32_t r = 0; r < kBatch; ++r) {
    SCOPED_TRACE("request " + std::to_string(r));
    EXPECT_EQ(reused(*m, shared), system / kTpb * kTpb);
    requests.push_back(open(*m, prompt_of(20 + r)));
    EXPECT_EQ(requests.back().cache->reuse_match().reused_tokens, system / kTpb * kTpb);
    step(engine, requests.back(), kLen);
  }
  EXPECT_EQ(m->storage_stats().active_caches, kBatch);
  EXPECT_EQ(testing::check_invariants(*m), "");
}

TEST(ReuseEdges, EveryCommittedEndpointOfAWindowSequenceStaysReusable) {
  expect_window_endpoints_reusable(64);
  expect_window_endpoints_reusable(256);
}

}  // namespace
}  // namespace hybridkv
