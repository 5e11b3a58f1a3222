#include "hybridkv/testing/fake_engine.h"

#include "hybridkv/testing/inspect.h"
#include "hybridkv/testing/mix.h"

#include <algorithm>
#include <cstring>

namespace hybridkv::testing {
namespace {

uint64_t mix(uint64_t x) { return mix64(x); }
uint64_t combine(uint64_t a, uint64_t b) { return mix(a ^ mix(b)); }

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

uint64_t scope_hash(const ReuseScope& s) {
  return combine(combine(s.lora_id.value_or(~0ull), s.salt.value_or(~0ull)), 0x5c09e);
}

}  // namespace

FakeEngine::FakeEngine(KvCacheManager& manager)
    : manager_(manager), device_memory_(manager.backend_kind() == BackendKind::kCuda) {
  const StoragePlan& plan = manager.plan();
  buffers_.resize(plan.cache_groups().size());
  const uint32_t ranks = manager.ranks();
  for (const CacheGroup& g : plan.cache_groups()) {
    for (uint32_t rank = 0; rank < ranks; ++rank) add_buffers(g, rank, ranks);
  }
}

// Each rank's bytes differ (its role hash is salted), so a page read from the wrong rank shows.
void FakeEngine::add_buffers(const CacheGroup& g, uint32_t rank, uint32_t ranks) {
  const StoragePlan& plan = manager_.plan();
  for (uint32_t b : g.buffers) {
    const PlannedBuffer& pb = plan.buffers()[b];
    // A state kept as a reduced-precision snapshot must survive the round trip bit for bit.
    WordShape shape;
    if (pb.snapshot_size != 0 && pb.snapshot_size != pb.size) {
      shape = pb.snapshot_dtype == DType::kFP8E4M3
                  ? WordShape{0x83f0000083f00000ull, 0x3c0000003c000000ull}  // 2^-7 <= |x| < 2
                  : WordShape{0xbfff0000bfff0000ull, 0};
    }
    const std::string where = ranks > 1 ? " of rank " + std::to_string(rank) : "";
    buffers_[g.id.value].push_back(
        {pb.layer, rank == 0 ? fnv(pb.role) : combine(fnv(pb.role), rank), pb.pool_group, pb.pool,
         pb.offset, pb.size, "layer " + std::to_string(pb.layer) + " " + pb.role + where, shape,
         rank});
  }
}

uint64_t FakeEngine::prefix(FakeRequest& r, uint32_t beam, uint64_t tokens) {
  if (r.prefix_hash.size() < r.tokens.size()) r.prefix_hash.resize(r.tokens.size());
  std::vector<uint64_t>& h = r.prefix_hash[beam];
  if (h.empty()) h.push_back(scope_hash(r.scope));  // h[n]: hash of the first n tokens
  while (h.size() <= tokens) {
    h.push_back(combine(h.back(), static_cast<uint32_t>(r.tokens[beam][h.size() - 1])));
  }
  return h[tokens];
}

std::byte* FakeEngine::page(const Buffer& b, int32_t slot) const {
  std::byte* base = manager_.slot_address(TierKind::kGpu, b.pool_group, b.pool,
                                          static_cast<uint32_t>(slot), b.rank);
  return base == nullptr ? nullptr : base + b.offset;
}

// The byte ranges of an n-byte region that a sampled write or check touches: [0, from) and
// [to, n), or the whole region.
std::pair<uint64_t, uint64_t> FakeEngine::sample_ranges(uint64_t n, uint64_t sample) {
  const uint64_t from = sample ? (sample + 7) / 8 * 8 : n;
  const uint64_t to = sample && n > 2 * from ? (n - sample) / 8 * 8 : 0;
  return to > from ? std::make_pair(from, to) : std::make_pair(n, n);
}

// Every word of [lo, hi) of a region whose byte 0 is at out - lo.
void FakeEngine::generate(std::byte* out, uint64_t lo, uint64_t hi, uint64_t seed,
                          WordShape shape) {
  for (uint64_t i = lo; i < hi; i += 8) {
    const uint64_t word = shape.apply(mix(seed + i));  // each word on its own: checks sample
    std::memcpy(out + (i - lo), &word, std::min<uint64_t>(8, hi - i));
  }
}

void FakeEngine::fill_bytes(std::byte* at, uint64_t n, uint64_t seed, WordShape shape) {
  const auto [skip_from, skip_to] = sample_ranges(n, sample_writes_);
  for (const auto& [lo, hi] : {std::pair<uint64_t, uint64_t>(0, std::min(skip_from, n)),
                               std::pair<uint64_t, uint64_t>(std::min(skip_to, n), n)}) {
    if (lo >= hi) continue;
    // Pools the CPU cannot address (CUDA's GPU tier) are written through the write stage.
    if (device_memory_) {
      generate(stage_write(at + lo, hi - lo), lo, hi, seed, shape);
    } else {
      generate(at + lo, lo, hi, seed, shape);
    }
  }
  bytes_written_ += n;
}

// `at` is CPU-readable: run_checks() has staged device memory first.
Status FakeEngine::check_bytes(const std::byte* at, uint64_t n, uint64_t seed,
                               const std::string& what, WordShape shape) {
  const auto [skip_from, skip_to] = sample_ranges(n, sample_bytes_);
  for (const auto& [lo, hi] : {std::pair<uint64_t, uint64_t>(0, std::min(skip_from, n)),
                               std::pair<uint64_t, uint64_t>(std::min(skip_to, n), n)}) {
    if (lo >= hi) continue;
    const std::byte* in = at + lo;
    for (uint64_t i = lo; i < hi; i += 8) {
      const uint64_t word = shape.apply(mix(seed + i));
      if (std::memcmp(in + (i - lo), &word, std::min<uint64_t>(8, hi - i)) != 0) {
        return Status::invalid("fake engine: mismatch in " + what + " at byte " +
                               std::to_string(i));
      }
    }
  }
  return Status::ok();
}

Status FakeEngine::verify(const KvCache& cache, FakeRequest& r) {
  if (cache.state() != CacheState::kActive) {
    return Status(StatusCode::kFailedPrecondition, "fake engine: verify needs an ACTIVE cache");
  }
  manager_.wait(cache.ready_event());
  const StoragePlan& plan = manager_.plan();
  if (r.initialize_on_first_use) {
    r.initialize_on_first_use = false;
    for (const CacheGroup& g : plan.cache_groups()) {
      const bool unselected = std::find(r.unselected_optional.begin(), r.unselected_optional.end(),
                                        g.id) != r.unselected_optional.end();
      if (g.policy == ReusePolicy::kPrivate || unselected) {
        if (Status s = write(cache, r, 0, r.computed, &g); !s) return s;
      }
    }
  }
  checks_.clear();
  regions_.clear();
  stage_bytes_ = 0;
  if (Status s = collect_checks(cache, r); !s) return s;
  return run_checks();
}

// Reads every region the checks look at: device memory in one batched transfer into the stage.
Status FakeEngine::run_checks() {
  if (device_memory_) {
    if (stage_.size() < stage_bytes_) stage_.resize(stage_bytes_);
    std::vector<PoolTransfer> transfers;
    for (const Region& g : regions_) {
      const auto [skip_from, skip_to] = sample_ranges(g.n, g.sampled ? sample_bytes_ : 0);
      for (const auto& [lo, hi] : {std::pair<uint64_t, uint64_t>(0, std::min(skip_from, g.n)),
                                   std::pair<uint64_t, uint64_t>(std::min(skip_to, g.n), g.n)}) {
        if (lo < hi) {
          // A read: the pool side is only read.
          transfers.push_back(
              {const_cast<std::byte*>(g.pool) + lo, stage_.data() + g.stage + lo, hi - lo});
        }
      }
    }
    read_pool_bytes(manager_, transfers);
  }
  for (const Check& c : checks_) {
    const Region& g = regions_[c.region];
    const std::byte* at = (device_memory_ ? stage_.data() + g.stage : g.pool) + c.offset;
    if (Status s = check_bytes(at, c.n, c.seed, c.what, c.shape); !s) return s;
  }
  return Status::ok();
}

uint32_t FakeEngine::add_region(const std::byte* pool, uint64_t n, bool sampled) {
  regions_.push_back({pool, n, sampled, stage_bytes_});
  stage_bytes_ += n;
  return static_cast<uint32_t>(regions_.size() - 1);
}

Status FakeEngine::collect_checks(const KvCache& cache, FakeRequest& r) {
  const StoragePlan& plan = manager_.plan();
  const uint32_t tpb = plan.config().tokens_per_block;
  const uint64_t history = cache.history();
  const uint64_t computed = std::min<uint64_t>(r.computed, cache.capacity());
  for (const CacheGroup& g : plan.cache_groups()) {
    for (uint32_t beam = 0; beam < cache.beam_width(); ++beam) {
      if (g.kind == GroupKind::kSsm) {
        if (!r.state_written) continue;
        const int32_t slot = *cache.state_index(g.id, beam);
        if (slot == kBadPageIndex) {
          return Status::invalid("fake engine: group " + std::to_string(g.id.value) + " beam " +
                                 std::to_string(beam) + " has no state slot");
        }
        const uint64_t seed_base = prefix(r, beam, r.computed);
        for (const Buffer& b : buffers_[g.id.value]) {
          const std::byte* at = page(b, slot);
          if (at == nullptr) continue;
          checks_.push_back({add_region(at, b.size, true), 0, b.size,
                             combine(seed_base, combine(b.layer, b.role_hash)), b.shape,
                             "group " + std::to_string(g.id.value) + " " + b.name +
                                 " state after " + std::to_string(r.computed) + " tokens, slot " +
                                 std::to_string(slot)});
        }
        ++pages_checked_;
        continue;
      }
      const std::span<const int32_t> table = *cache.block_table(g.id, beam);
      const uint64_t live_begin = g.first_live_block(history, tpb);
      const ScratchDesc scratch = *cache.scratch(g.id);
      for (uint64_t block = 0; block * tpb < computed; ++block) {
        const int32_t slot = table[block];
        if (slot == kBadPageIndex) {
          if (block < live_begin && block >= g.sink_blocks) continue;  // stale window block
          // SWA scratch: the step's stale blocks, which nothing reads after the step.
          if (scratch.contains(block)) continue;
          return Status::invalid("fake engine: group " + std::to_string(g.id.value) + " beam " +
                                 std::to_string(beam) + " block " + std::to_string(block) +
                                 " has no page");
        }
        const uint64_t end = std::min<uint64_t>((block + 1) * tpb, computed);
        for (const Buffer& b : buffers_[g.id.value]) {
          const std::byte* at = page(b, slot);
          if (at == nullptr) continue;
          // The page's written bytes as one region; a check per token within it.
          const uint32_t region = add_region(at, (end - block * tpb) * b.size / tpb, false);
          for (uint64_t p = block * tpb; p < end; ++p) {
            const uint64_t j = p - block * tpb;
            const uint64_t lo = j * b.size / tpb, hi = (j + 1) * b.size / tpb;
            checks_.push_back({region, lo, hi - lo,
                               combine(prefix(r, beam, p + 1), combine(b.layer, b.role_hash)),
                               WordShape{},
                               "group " + std::to_string(g.id.value) + " " + b.name + " token " +
                                   std::to_string(p) + " (block " + std::to_string(block) +
                                   ", slot " + std::to_string(slot) + ")"});
          }
        }
        ++pages_checked_;
      }
    }
  }
  return Status::ok();
}

void FakeEngine::adopt_reuse(const KvCache& cache, FakeRequest& r) {
  r.computed = cache.history();
  r.state_written = r.computed > 0;
  r.initialize_on_first_use = r.computed > 0;
}

Status FakeEngine::recompute_group(const KvCache& cache, FakeRequest& r, CacheGroupId group) {
  manager_.wait(cache.ready_event());
  return write(cache, r, 0, r.computed, &manager_.plan().cache_group(group));
}

Status FakeEngine::step(const KvCache& cache, FakeRequest& r, uint64_t upto) {
  if (Status s = verify(cache, r); !s) return s;
  return write_step(cache, r, upto);
}

Status FakeEngine::write_step(const KvCache& cache, FakeRequest& r, uint64_t upto) {
  manager_.wait(cache.ready_event());
  if (r.initialize_on_first_use) {
    r.initialize_on_first_use = false;
    for (const CacheGroup& g : manager_.plan().cache_groups()) {
      const bool unselected = std::find(r.unselected_optional.begin(), r.unselected_optional.end(),
                                        g.id) != r.unselected_optional.end();
      if (g.policy == ReusePolicy::kPrivate || unselected) {
        if (Status s = write(cache, r, 0, r.computed, &g); !s) return s;
      }
    }
  }
  if (upto > cache.capacity() || upto < r.computed) {
    return Status::invalid("fake engine: step to " + std::to_string(upto) + " with capacity " +
                           std::to_string(cache.capacity()) + " and " + std::to_string(r.computed) +
                           " computed");
  }
  for (uint32_t beam = 0; beam < cache.beam_width(); ++beam) {
    if (r.tokens[beam].size() < upto) return Status::invalid("fake engine: too few tokens");
  }
  if (Status s = write(cache, r, r.computed, upto, nullptr); !s) return s;
  r.computed = upto;
  r.state_written = true;
  return Status::ok();
}

// Room for `n` bytes bound for pool memory at `pool`, sent by the next flush_writes().
std::byte* FakeEngine::stage_write(std::byte* pool, uint64_t n) {
  const uint64_t at = write_stage_.size();
  write_stage_.resize(at + n);
  pending_writes_.push_back({pool, at, n});
  return write_stage_.data() + at;
}

void FakeEngine::flush_writes() {
  std::vector<PoolTransfer> transfers;
  for (const PendingWrite& w : pending_writes_)
    transfers.push_back({w.pool, write_stage_.data() + w.stage, w.n});
  if (!transfers.empty()) write_pool_bytes(manager_, transfers);
  pending_writes_.clear();
  write_stage_.clear();
}

Status FakeEngine::write(const KvCache& cache, FakeRequest& r, uint64_t from, uint64_t upto,
                         const CacheGroup* only) {
  const Status s = write_unflushed(cache, r, from, upto, only);
  flush_writes();
  return s;
}

Status FakeEngine::write_unflushed(const KvCache& cache, FakeRequest& r, uint64_t from,
                                   uint64_t upto, const CacheGroup* only) {
  const StoragePlan& plan = manager_.plan();
  const uint32_t tpb = plan.config().tokens_per_block;
  for (const CacheGroup& g : plan.cache_groups()) {
    if (only != nullptr && only->id != g.id) continue;
    for (uint32_t beam = 0; beam < cache.beam_width(); ++beam) {
      if (g.kind == GroupKind::kSsm) {
        const int32_t slot = *cache.state_index(g.id, beam);
        if (slot == kBadPageIndex) return Status::invalid("fake engine: no state slot");
        const uint64_t seed_base = prefix(r, beam, upto);
        for (const Buffer& b : buffers_[g.id.value]) {
          if (std::byte* at = page(b, slot)) {
            fill_bytes(at, b.size, combine(seed_base, combine(b.layer, b.role_hash)), b.shape);
          }
        }
        continue;
      }
      const std::span<const int32_t> table = *cache.block_table(g.id, beam);
      const uint64_t history = cache.history();
      const uint64_t live_begin = g.first_live_block(history, tpb);
      const ScratchDesc scratch = *cache.scratch(g.id);
      for (uint64_t p = from; p < upto;) {
        const uint64_t block = p / tpb, block_end = std::min<uint64_t>((block + 1) * tpb, upto);
        const int32_t slot = table[block];
        if (slot == kBadPageIndex) {
          // SWA scratch blocks are written and read within the step by the real kernels; the
          // fake engine checks only what outlives a step, so it skips them.
          const bool stale = only != nullptr && block < live_begin && block >= g.sink_blocks;
          if (stale || scratch.contains(block)) {
            p = block_end;
            continue;
          }
          return Status::invalid("fake engine: writing token " + std::to_string(p) + " of group " +
                                 std::to_string(g.id.value) + ": block " + std::to_string(block) +
                                 " has no page");
        }
        for (const Buffer& b : buffers_[g.id.value]) {
          if (std::byte* at = page(b, slot)) write_tokens(r, beam, b, at, p, block_end);
        }
        p = block_end;
      }
    }
  }
  return Status::ok();
}

void FakeEngine::write_states_at(const KvCache& cache, FakeRequest& r, CacheGroupId group,
                                 std::span<const uint64_t> points, std::span<const int32_t> slots) {
  manager_.wait(cache.ready_event());  // a reserved page waits for its slot's last user
  for (size_t i = 0; i < points.size() && i < slots.size(); ++i) {
    const uint64_t seed_base = prefix(r, 0, points[i]);
    for (const Buffer& b : buffers_[group.value]) {
      if (std::byte* at = page(b, slots[i]))
        fill_bytes(at, b.size, combine(seed_base, combine(b.layer, b.role_hash)), b.shape);
    }
  }
  flush_writes();
}

// Tokens [p, end) of one block of one buffer (`at`: the page); one copy for device memory.
void FakeEngine::write_tokens(FakeRequest& r, uint32_t beam, const Buffer& b, std::byte* at,
                              uint64_t p, uint64_t end) {
  const uint32_t tpb = manager_.plan().config().tokens_per_block;
  const uint64_t first = p % tpb * b.size / tpb, last = ((end - 1) % tpb + 1) * b.size / tpb;
  std::byte* staged = device_memory_ ? stage_write(at + first, last - first) : nullptr;
  for (uint64_t q = p; q < end; ++q) {
    const uint64_t j = q % tpb, lo = j * b.size / tpb, hi = (j + 1) * b.size / tpb;
    const uint64_t seed = combine(prefix(r, beam, q + 1), combine(b.layer, b.role_hash));
    if (device_memory_) {
      generate(staged + (lo - first), 0, hi - lo, seed, WordShape{});
      bytes_written_ += hi - lo;
    } else {
      fill_bytes(at + lo, hi - lo, seed);
    }
  }
}

}  // namespace hybridkv::testing
