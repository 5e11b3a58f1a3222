// A small hybrid model on the CPU with random weights drives the cache like an engine would: an
// attention layer reads its K/V through the block tables, a recurrent layer keeps its state
// (and conv window) in its SSM slot, and speculative decoding with random accept/reject keeps
// the inputs of accepted drafts in PRIVATE replay pages, replayed onto the checkpoint state
// every step. The same requests run once alone (no reuse, no pressure) and once together with
// prefix reuse, snapshots, suspend/resume and slot theft: the generated tokens and the final
// states must be bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "hybridkv/hybrid.h"
#include "hybridkv/testing/inspect.h"
#include "lifecycle_fixture.h"

namespace hybridkv {
namespace {

constexpr int kDim = 8, kVocab = 61, kSpec = 3, kTpb = 16;
constexpr int kReplayCap = 2 * (kSpec + 1);  // accepted inputs kept before a fold
constexpr LayerId kRecurrent = 0, kAttention = 1;

struct Weights {
  float embed[kVocab][kDim], a[kDim], b[kDim], c0[kDim], c1[kDim];
  float wq[kDim][kDim], wk[kDim][kDim], wv[kDim][kDim], wo[kVocab][kDim];
  explicit Weights(uint64_t seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& row : embed)
      for (float& x : row) x = u(rng);
    for (int i = 0; i < kDim; ++i) {
      a[i] = 0.5f + 0.4f * u(rng);
      b[i] = u(rng);
      c0[i] = 0.5f * u(rng);
      c1[i] = 0.5f * u(rng);
    }
    for (auto* m : {&wq, &wk, &wv})
      for (auto& row : *m)
        for (float& x : row) x = u(rng) / 2;
    for (auto& row : wo)
      for (float& x : row) x = u(rng);
  }
};

ManagerConfig reference_config(bool reuse) {
  ManagerConfig c;
  c.tokens_per_block = kTpb;
  SsmLayerConfig ssm;
  ssm.id = kRecurrent;
  ssm.buffers = {{"ssm_state", kDim * 4, {}, DType::kF32},
                 {"conv_state", 2 * kDim * 4, {}, DType::kF32},
                 {"replay_x", kReplayCap * kDim * 4, ReusePolicy::kPrivate, DType::kF32},
                 {"replay_meta", 16, ReusePolicy::kPrivate, {}}};
  AttentionLayerConfig att;
  att.id = kAttention;
  att.buffers = {{"key", kTpb * kDim * 4, {}, DType::kF32},
                 {"value", kTpb * kDim * 4, {}, DType::kF32}};
  c.ssm_layers = {ssm};
  c.attention_layers = {att};
  c.enable_block_reuse = reuse;
  c.commit_min_snapshot = true;
  c.max_live_kv_caches = 8;
  return c;
}

// The engine side of one request.
struct Sequence {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  int32_t last = -1;  // the token whose K/V is computed next
  uint64_t seed = 0;
  int steps = 0;
};

class Engine {
 public:
  Engine(HybridCacheManager& h, const Weights& w) : h_(h), w_(w) {}

  float* buffer(TierKind tier, LayerId layer, const char* role, int32_t slot) {
    const PlannedBuffer& b = **h_.plan().find_buffer(layer, role);
    return reinterpret_cast<float*>(h_.manager().slot_address(tier, b.pool_group, b.pool, slot) +
                                    b.offset);
  }

  // The recurrent state now: the checkpoint with the accepted inputs since it replayed.
  void current_state(KvCache& c, float* s, float* conv) {
    const int32_t state = *c.state_index(*h_.state_group());
    const int32_t replay = *c.state_index(*h_.replay_group());
    std::memcpy(s, buffer(TierKind::kGpu, kRecurrent, "ssm_state", state), kDim * 4);
    std::memcpy(conv, buffer(TierKind::kGpu, kRecurrent, "conv_state", state), 2 * kDim * 4);
    const uint32_t n = meta(replay)[0];
    const float* xs = buffer(TierKind::kGpu, kRecurrent, "replay_x", replay);
    for (uint32_t i = 0; i < n; ++i) recur(xs + i * kDim, s, conv);
  }

  uint32_t* meta(int32_t replay_slot) {
    return reinterpret_cast<uint32_t*>(
        buffer(TierKind::kGpu, kRecurrent, "replay_meta", replay_slot));
  }

  void recur(const float* e, float* s, float* conv) {
    for (int i = 0; i < kDim; ++i) {
      const float u = e[i] + w_.c0[i] * conv[i] + w_.c1[i] * conv[kDim + i];
      s[i] = w_.a[i] * s[i] + w_.b[i] * u;
    }
    std::memcpy(conv + kDim, conv, kDim * 4);
    std::memcpy(conv, e, kDim * 4);
  }

  // Processes token x at position p: recurrence, K/V written into the page of p's block,
  // attention over positions [0, p] read through the block table. Returns the greedy next token.
  int32_t token(KvCache& c, int32_t x, uint64_t p, float* s, float* conv) {
    recur(w_.embed[x], s, conv);
    float h[kDim], q[kDim], k[kDim], v[kDim];
    for (int i = 0; i < kDim; ++i) h[i] = std::tanh(s[i]) + w_.embed[x][i];
    matvec(w_.wq, h, q);
    matvec(w_.wk, h, k);
    matvec(w_.wv, h, v);
    const CacheGroupId att = *h_.plan().buffer_group_id(kAttention, "key");
    const auto table = *c.block_table(att);
    const int32_t slot = table[p / kTpb];
    std::memcpy(buffer(TierKind::kGpu, kAttention, "key", slot) + (p % kTpb) * kDim, k, kDim * 4);
    std::memcpy(buffer(TierKind::kGpu, kAttention, "value", slot) + (p % kTpb) * kDim, v, kDim * 4);
    std::vector<float> scores(p + 1);
    float top = -1e30f;
    for (uint64_t j = 0; j <= p; ++j) {
      const float* kj =
          buffer(TierKind::kGpu, kAttention, "key", table[j / kTpb]) + (j % kTpb) * kDim;
      float dot = 0;
      for (int i = 0; i < kDim; ++i) dot += q[i] * kj[i];
      scores[j] = dot / std::sqrt(static_cast<float>(kDim));
      top = std::max(top, scores[j]);
    }
    float o[kDim] = {}, total = 0;
    for (uint64_t j = 0; j <= p; ++j) {
      const float wgt = std::exp(scores[j] - top);
      total += wgt;
      const float* vj =
          buffer(TierKind::kGpu, kAttention, "value", table[j / kTpb]) + (j % kTpb) * kDim;
      for (int i = 0; i < kDim; ++i) o[i] += wgt * vj[i];
    }
    int32_t best = 0;
    float best_logit = -1e30f;
    for (int t = 0; t < kVocab; ++t) {
      float logit = 0;
      for (int i = 0; i < kDim; ++i) logit += w_.wo[t][i] * (h[i] + o[i] / total);
      if (logit > best_logit) {
        best_logit = logit;
        best = t;
      }
    }
    return best;
  }

  static void matvec(const float (&m)[kDim][kDim], const float* x, float* y) {
    for (int r = 0; r < kDim; ++r) {
      y[r] = 0;
      for (int i = 0; i < kDim; ++i) y[r] += m[r][i] * x[i];
    }
  }

  // The step's indices; applies the replay resets it reports and waits for the pages.
  Result<HybridCacheManager::Step> begin_step(uint64_t id) {
    const std::vector<uint64_t> ids = {id};
    Result<HybridCacheManager::Step> step = h_.prepare_step(ids, 0);
    if (!step) return step;
    h_.manager().wait(h_.cache(id)->ready_event());
    for (int32_t r : step->replay_resets) meta(r)[0] = 0;  // a fresh replay page: nothing pending
    return step;
  }

  void write_checkpoint(KvCache& c, const float* s, const float* conv) {
    const int32_t state = *c.state_index(*h_.state_group());
    std::memcpy(buffer(TierKind::kGpu, kRecurrent, "ssm_state", state), s, kDim * 4);
    std::memcpy(buffer(TierKind::kGpu, kRecurrent, "conv_state", state), conv, 2 * kDim * 4);
  }

  // Prefill up to the next snapshot point, and commit there.
  Status prefill_chunk(uint64_t id, Sequence& q) {
    KvCache& c = *h_.cache(id);
    const uint64_t from = c.history();
    const uint64_t to = *h_.next_snapshot_point(id);
    if (Status s = h_.resize(id, to, from); !s) return s;
    Result<HybridCacheManager::Step> step = begin_step(id);
    if (!step) return step.status();
    float s[kDim], conv[2 * kDim];
    current_state(c, s, conv);
    int32_t next = -1;
    for (uint64_t p = from; p < to; ++p) next = token(c, q.prompt[p], p, s, conv);
    write_checkpoint(c, s, conv);
    if (Status st = h_.resize(id, to, to); !st) return st;
    if (Status st = h_.commit_at_snapshot(id); !st) return st;
    if (to == q.prompt.size()) {
      q.last = next;  // the first generated token
      q.generated.push_back(next);
    }
    return Status::ok();
  }

  // One speculative decode step: S greedy drafts, a random number accepted, their inputs kept
  // in the replay pages (folded into the checkpoint when the replay pages are full).
  Status decode_step(uint64_t id, Sequence& q) {
    KvCache& c = *h_.cache(id);
    const uint64_t history = c.history();
    if (Status s = h_.resize(id, history + kSpec + 1, history); !s) return s;
    Result<HybridCacheManager::Step> step = begin_step(id);
    if (!step) return step.status();
    float s[kDim], conv[2 * kDim];
    current_state(c, s, conv);
    // Drafts: the greedy continuation (the bonus token after the last one comes for free).
    std::vector<int32_t> in = {q.last};
    std::vector<int32_t> pred;
    for (int i = 0; i <= kSpec; ++i) {
      pred.push_back(token(c, in.back(), history + i, s, conv));
      if (i < kSpec) in.push_back(pred.back());
    }
    std::mt19937_64 coin(q.seed * 1000003 + static_cast<uint64_t>(q.steps++));
    int accepted = 0;
    while (accepted < kSpec && coin() % 2 == 0) ++accepted;
    // Tokens whose K/V stays: last and the accepted drafts; the next token is the bonus.
    const int32_t replay = step->entries[0].replay_index;
    uint32_t& n = meta(replay)[0];
    if (n + accepted + 1 > kReplayCap) {
      // Fold: the checkpoint becomes the state before this step's tokens.
      float cs[kDim], cc[2 * kDim];
      current_state(c, cs, cc);
      write_checkpoint(c, cs, cc);
      n = 0;
    }
    float* xs = buffer(TierKind::kGpu, kRecurrent, "replay_x", replay);
    for (int i = 0; i <= accepted; ++i) {
      std::memcpy(xs + (n + i) * kDim, w_.embed[in[i]], kDim * 4);
    }
    n += static_cast<uint32_t>(accepted + 1);
    for (int i = 0; i < accepted; ++i) q.generated.push_back(in[i + 1]);
    q.generated.push_back(pred[accepted]);
    q.last = pred[accepted];
    return h_.resize(id, history + accepted + 1, history + accepted + 1);
  }

  // The final recurrent state, for comparison.
  std::vector<float> final_state(uint64_t id) {
    KvCache& c = *h_.cache(id);
    h_.manager().wait(c.ready_event());
    float s[kDim], conv[2 * kDim];
    current_state(c, s, conv);
    std::vector<float> out(s, s + kDim);
    out.insert(out.end(), conv, conv + 2 * kDim);
    return out;
  }

 private:
  HybridCacheManager& h_;
  const Weights& w_;
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> state;
};

ServingConfig reference_serving() {
  ServingConfig s;
  s.max_batch = 4;
  s.tokens_per_block = kTpb;
  s.snapshots.periodic_interval = 16;
  return s;
}

std::vector<Sequence> make_sequences(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> system(40);
  for (int32_t& t : system) t = static_cast<int32_t>(rng() % kVocab);
  std::vector<Sequence> out;
  for (int r = 0; r < 6; ++r) {
    Sequence q;
    q.prompt = system;
    if (r % 2 == 1) q.prompt.resize(25);  // some share a shorter prefix (unaligned)
    const int extra = 5 + static_cast<int>(rng() % 30);
    for (int i = 0; i < extra; ++i) q.prompt.push_back(static_cast<int32_t>(rng() % kVocab));
    q.seed = seed + r;
    out.push_back(q);
  }
  out.push_back(out[0]);  // an exact repeat: reuses everything but the last token
  out.back().seed = seed + 99;
  return out;
}

constexpr int kDecodeSteps = 12;

// Each request alone: no reuse, nothing else on the cache.
std::vector<Outcome> run_alone(uint64_t seed, const Weights& w) {
  std::vector<Outcome> out;
  for (Sequence q : make_sequences(seed)) {
    ManagerConfig c = reference_config(false);
    c.tiers = {{TierKind::kGpu, 4ull << 20, ""}};
    auto h = std::move(HybridCacheManager::create(c, reference_serving(),
                                                  BackendOptions{BackendKind::kHost}))
                 .value();
    Engine e(*h, w);
    EXPECT_OK(h->add_request(1, q.prompt));
    EXPECT_OK(h->resume(1));
    for (int guard = 0; q.last < 0 && guard < 100; ++guard) {
      const Status s = e.prefill_chunk(1, q);
      EXPECT_TRUE(s.is_ok()) << s.to_string();
      if (!s.is_ok()) break;
    }
    for (int i = 0; i < kDecodeSteps; ++i) EXPECT_OK(e.decode_step(1, q));
    out.push_back({q.generated, e.final_state(1)});
  }
  return out;
}

// All requests together on a small GPU with a host tier: prefix reuse, snapshots, random
// suspends, other requests taking the suspended ones' slots.
std::vector<Outcome> run_together(uint64_t seed, const Weights& w, uint64_t* suspends,
                                  uint64_t* reused) {
  std::vector<Sequence> qs = make_sequences(seed);
  ManagerConfig c = reference_config(true);
  c.constraints = {BatchShape{{{96, 95}}, {}}};
  c.max_live_kv_caches = static_cast<uint32_t>(qs.size());
  c.tiers = {{TierKind::kGpu, 1, ""}, {TierKind::kHost, 8ull << 20, ""}};
  c.tiers[0].quota_bytes = *minimum_gpu_quota(c);
  // Floors only: the GPU holds about one request at a time, so others keep taking slots.
  auto h = std::move(HybridCacheManager::create(c, reference_serving(),
                                                BackendOptions{BackendKind::kHost}))
               .value();
  Engine e(*h, w);
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::vector<int> done(qs.size(), 0);  // decode steps done
  std::vector<bool> added(qs.size(), false);
  size_t finished = 0;
  std::map<size_t, Outcome> out;
  for (int guard = 0; finished < qs.size() && guard < 200000; ++guard) {
    const size_t r = rng() % qs.size();
    if (done[r] == kDecodeSteps) continue;
    if (!added[r]) {
      // Requests arrive in order, so later ones find earlier ones' prefixes in the tree.
      if (r > 0 && !added[r - 1]) continue;
      EXPECT_OK(h->add_request(r, qs[r].prompt));
      *reused += h->cache(r)->reuse_match().reused_tokens;
      added[r] = true;
    }
    KvCache& cache = *h->cache(r);
    if (cache.state() == CacheState::kSuspended && !h->resume(r).is_ok()) {
      // No room: suspend someone else and try again later.
      for (size_t o = 0; o < qs.size(); ++o) {
        if (added[o] && h->cache(o) && h->cache(o)->state() == CacheState::kActive) {
          EXPECT_OK(h->suspend(o));
          ++*suspends;
          break;
        }
      }
      continue;
    }
    for (int burst = 1 + static_cast<int>(rng() % 3); burst > 0 && done[r] < kDecodeSteps;
         --burst) {
      Status s = qs[r].last < 0 ? e.prefill_chunk(r, qs[r]) : e.decode_step(r, qs[r]);
      if (s.code() == StatusCode::kOutOfPages) break;
      EXPECT_OK(s);
      if (qs[r].last >= 0 && s.is_ok() && qs[r].generated.size() > 1) ++done[r];
    }
    if (done[r] == kDecodeSteps) {
      out[r] = {qs[r].generated, e.final_state(r)};
      EXPECT_OK(h->free_request(r));
      ++finished;
    } else if (rng() % 2 == 0) {
      EXPECT_OK(h->suspend(r));
      ++*suspends;
    }
    EXPECT_EQ(testing::check_invariants(h->manager()), "");
  }
  std::vector<Outcome> result;
  for (size_t r = 0; r < qs.size(); ++r) result.push_back(out[r]);
  return result;
}

TEST(ReferenceModel, ReuseSnapshotsSuspendAndSlotTheftChangeNoBit) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const Weights w(seed);
  const std::vector<Outcome> alone = run_alone(seed, w);
  uint64_t suspends = 0, reused = 0;
  const std::vector<Outcome> together = run_together(seed, w, &suspends, &reused);
  ASSERT_EQ(alone.size(), together.size());
  for (size_t r = 0; r < alone.size(); ++r) {
    SCOPED_TRACE("request " + std::to_string(r) + ", seed " + std::to_string(seed));
    EXPECT_EQ(alone[r].tokens, together[r].tokens);
    ASSERT_EQ(alone[r].state.size(), together[r].state.size());
    EXPECT_EQ(std::memcmp(alone[r].state.data(), together[r].state.data(),
                          alone[r].state.size() * sizeof(float)),
              0);
  }
  std::printf("suspends %llu, reused tokens %llu\n", static_cast<unsigned long long>(suspends),
              static_cast<unsigned long long>(reused));
  EXPECT_GT(suspends, 0u);
  EXPECT_GT(reused, 0u);
}

// Reduced-precision snapshots (issue 12 item 5): a request resumes from a bf16 snapshot of an
// identical earlier prompt and generates 256 tokens; against the same request run alone in fp32
// the drift is measured (and printed): the recurrent state's largest difference at the resume
// point and at the end, and how many greedy tokens agree before the first difference. With fp32
// snapshots the same run changes no bit (the control).
struct Drift {
  float resume_error = 0;  // largest |difference| of the state just after the resumed prefill
  float end_error = 0;     // ... after the last generated token
  size_t agree = 0;        // generated tokens equal before the first difference
  size_t tokens = 0;       // generated tokens compared
  uint64_t reused = 0;
};

constexpr size_t kDriftTokens = 256;

Outcome generate(HybridCacheManager& h, Engine& e, Sequence q, uint64_t id, float* state_after) {
  EXPECT_OK(h.add_request(id, q.prompt));
  EXPECT_OK(h.resume(id));
  for (int guard = 0; q.last < 0 && guard < 100; ++guard) EXPECT_OK(e.prefill_chunk(id, q));
  const std::vector<float> at_resume = e.final_state(id);
  std::copy(at_resume.begin(), at_resume.end(), state_after);
  while (q.generated.size() < kDriftTokens) EXPECT_OK(e.decode_step(id, q));
  q.generated.resize(kDriftTokens);
  return {q.generated, e.final_state(id)};
}

Drift resume_drift(uint64_t seed, const Weights& w, std::optional<DType> snapshot_dtype) {
  const Sequence q = make_sequences(seed)[0];
  float alone_state[3 * kDim], resumed_state[3 * kDim];
  Outcome alone, resumed;
  Drift d;
  {
    ManagerConfig c = reference_config(false);
    c.tiers = {{TierKind::kGpu, 4ull << 20, ""}};
    auto h = std::move(HybridCacheManager::create(c, reference_serving(),
                                                  BackendOptions{BackendKind::kHost}))
                 .value();
    Engine e(*h, w);
    alone = generate(*h, e, q, 1, alone_state);
  }
  {
    ManagerConfig c = reference_config(true);
    c.tiers = {{TierKind::kGpu, 4ull << 20, ""}};
    c.snapshot_dtype = snapshot_dtype;
    auto h = std::move(HybridCacheManager::create(c, reference_serving(),
                                                  BackendOptions{BackendKind::kHost}))
                 .value();
    Engine e(*h, w);
    Sequence first = q;
    EXPECT_OK(h->add_request(1, first.prompt));
    EXPECT_OK(h->resume(1));
    for (int guard = 0; first.last < 0 && guard < 100; ++guard)
      EXPECT_OK(e.prefill_chunk(1, first));
    EXPECT_OK(h->free_request(1));
    resumed = generate(*h, e, q, 2, resumed_state);
    d.reused = h->cache(2)->reuse_match().reused_tokens;
  }
  for (int i = 0; i < 3 * kDim; ++i) {
    d.resume_error = std::max(d.resume_error, std::fabs(alone_state[i] - resumed_state[i]));
    d.end_error = std::max(d.end_error, std::fabs(alone.state[i] - resumed.state[i]));
  }
  d.tokens = alone.tokens.size();
  while (d.agree < d.tokens && alone.tokens[d.agree] == resumed.tokens[d.agree]) ++d.agree;
  return d;
}

TEST(ReferenceModel, ReducedPrecisionSnapshotDriftIsMeasuredAndFp32ChangesNoBit) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const Weights w(seed);
  const Drift exact = resume_drift(seed, w, std::nullopt);
  EXPECT_GT(exact.reused, 0u);
  EXPECT_EQ(exact.resume_error, 0.f);
  EXPECT_EQ(exact.end_error, 0.f);
  EXPECT_EQ(exact.agree, exact.tokens);
  for (const DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
    const Drift d = resume_drift(seed, w, dtype);
    std::printf(
        "%s snapshot, resumed at %llu tokens: state error %.3g after the prefill, %.3g after "
        "%zu generated tokens; %zu of %zu greedy tokens agree before the first difference\n",
        dtype_name(dtype), static_cast<unsigned long long>(d.reused), d.resume_error, d.end_error,
        d.tokens, d.agree, d.tokens);
    EXPECT_EQ(d.reused, exact.reused);
    EXPECT_GT(d.resume_error, 0.f);  // the snapshot really was rounded
    EXPECT_LT(d.resume_error, dtype == DType::kBF16 ? 0.05f : 0.5f);
    EXPECT_TRUE(std::isfinite(d.end_error));
  }
}

}  // namespace
}  // namespace hybridkv
