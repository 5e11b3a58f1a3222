// `hybridkv sim --instances N --router random|prefix [--shared-quota BYTES]`: a fleet of serving
// instances in one process, each its own manager with the quotas given (per instance), ticked in
// turn one step at a time so that what one publishes reaches the others while they serve.
//
// The router sends each request to an instance when the run starts:
//   random  uniformly (a fixed seed);
//   prefix  cache-aware, as SGLang's router: to the instance that was sent the longest prefix of
//           the prompt's 512-token block ids, when that covers at least half the prompt; else to
//           the instance with the fewest prompt tokens so far.
// The shared tier is a MemoryStore of --shared-quota bytes (least recently used evicted, as a
// Redis with maxmemory and allkeys-lru), written through after every step, so that a run is
// deterministic. With the none backend its objects carry no bytes and
// each is charged its page's bytes (modelled); with --backend host they carry the pages.
// --shared-redis puts the fleet on a real Redis instead.
#include <charconv>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "hybridkv/shared_object.h"
#include "hybridkv/testing/memory_store.h"
#include "hybridkv/units.h"
#include "sim_internal.h"

namespace hybridkv::tools {
namespace {

using ull = unsigned long long;

std::vector<uint32_t> route(const std::vector<TraceRequest>& trace, uint32_t n,
                            const std::string& router) {
  std::vector<uint32_t> to(trace.size(), 0);
  if (router == "random") {
    std::mt19937_64 rng(1);
    for (uint32_t& k : to) k = static_cast<uint32_t>(rng() % n);
    return to;
  }
  // The block ids sent so far, as a trie; each node names the instance last sent it.
  std::map<std::pair<uint32_t, uint64_t>, uint32_t> child;
  std::vector<uint32_t> owner = {UINT32_MAX};  // node 0: the root
  std::vector<uint64_t> load(n, 0);
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceRequest& t = trace[i];
    uint32_t node = 0, best = UINT32_MAX;
    uint64_t depth = 0;
    for (uint64_t h : t.hash_ids) {
      auto it = child.find({node, h});
      if (it == child.end()) break;
      node = it->second;
      best = owner[node];
      ++depth;
    }
    uint32_t pick = best;
    if (best == UINT32_MAX || 2 * depth * kMooncakeBlock < t.input_length)
      pick = static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[pick] += t.input_length;
    node = 0;
    for (uint64_t h : t.hash_ids) {
      auto [it, added] = child.try_emplace({node, h}, static_cast<uint32_t>(owner.size()));
      if (added) owner.push_back(pick);
      node = it->second;
      owner[node] = pick;
    }
    to[i] = pick;
  }
  return to;
}

// What a modelled object (no payload) costs in the store: its page's bytes, from its key
// ("hkv1:<fingerprint>:r<rank>:<k|s><cache group>:<chain digest>"). Real objects cost their size.
testing::MemoryStore::Charge page_charge(const StoragePlan& plan) {
  std::vector<uint64_t> kv, snapshot;
  for (const CacheGroup& g : plan.cache_groups()) {
    kv.push_back(plan.pool_group(g.page_pool_group(false)).slot_bytes);
    snapshot.push_back(plan.pool_group(g.page_pool_group(true)).slot_bytes);
  }
  return [kv, snapshot](std::string_view key, uint64_t size) -> uint64_t {
    constexpr uint64_t kFraming = kSharedObjectHeaderBytes + kSharedObjectTrailerBytes;
    if (size > kFraming) return size;
    size_t at = 0;
    for (int colon = 0; colon < 3 && at != std::string_view::npos; ++colon)
      at = key.find(':', at == 0 ? 0 : at + 1);
    uint32_t group = 0;
    if (at == std::string_view::npos || at + 2 >= key.size() ||
        std::from_chars(key.data() + at + 2, key.data() + key.size(), group).ec != std::errc{} ||
        group >= kv.size()) {
      return size;
    }
    return size + (key[at + 1] == 's' ? snapshot[group] : kv[group]);
  };
}

// --shared-quota in bytes; nullopt: no shared tier in memory (unset or "none").
std::optional<uint64_t> shared_quota(const SimOptions& o) {
  if (o.shared_quota.empty() || o.shared_quota == "none") return std::nullopt;
  return parse_bytes(o.shared_quota);
}

double percent(uint64_t part, uint64_t whole) { return whole ? 100.0 * part / whole : 0.0; }

}  // namespace

Status check_fleet_options(const SimOptions& o) {
  if (o.instances == 0) return Status::invalid("--instances: 0 must be > 0");
  if (o.router != "random" && o.router != "prefix")
    return Status::invalid("--router: '" + o.router + "' is not random or prefix");
  const bool quota = !o.shared_quota.empty() && o.shared_quota != "none";
  if (quota && !shared_quota(o))
    return Status::invalid("--shared-quota: '" + o.shared_quota + "' is not a byte count");
  if (quota && !o.shared_redis.empty())
    return Status::invalid("--shared-quota and --shared-redis: the fleet has one shared tier");
  if (quota && o.instances == 1) return Status::invalid("--shared-quota needs --instances above 1");
  if (o.instances > 1 && o.instance != "0/1")
    return Status::invalid("--instances and --instance: one process runs the whole fleet");
  if (o.instances > 1 && o.verify)
    return Status::invalid("--verify runs one instance (without --instances)");
  return Status::ok();
}

int run_fleet(const SimOptions& o, ServingConfig serving, const std::vector<TraceRequest>& trace,
              const ManagerFactory& make) {
  const uint32_t n = o.instances;
  std::shared_ptr<testing::MemoryStore> store;
  auto charge = std::make_shared<testing::MemoryStore::Charge>();
  const std::optional<uint64_t> quota = shared_quota(o);
  if (quota) {
    store = std::make_shared<testing::MemoryStore>(
        *quota, [charge](std::string_view key, uint64_t size) { return (*charge)(key, size); });
    serving.shared.store = store;
    serving.shared.model_id = o.model;
  }
  const std::vector<uint32_t> to = route(trace, n, o.router);
  std::vector<std::vector<TraceRequest>> shares(n);
  for (size_t i = 0; i < trace.size(); ++i) shares[to[i]].push_back(trace[i]);
  SimOptions each = o;
  each.quiet = true;
  std::vector<std::unique_ptr<HybridCacheManager>> managers;
  std::vector<std::vector<uint64_t>> bounds;
  for (uint32_t k = 0; k < n; ++k) {
    Result<std::unique_ptr<HybridCacheManager>> m = make(serving, shares[k]);
    if (!m) return fail("instance " + std::to_string(k) + ": " + m.status().message());
    managers.push_back(std::move(m).value());
    bounds.push_back(reuse_bound(shares[k]));
  }
  *charge = page_charge(managers.front()->plan());
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<SchedulerRun>> runs;
  for (uint32_t k = 0; k < n; ++k)
    runs.push_back(
        std::make_unique<SchedulerRun>(each, shares[k], bounds[k], *managers[k], nullptr));
  // With the store in memory, what a step publishes is in it before the next instance's step:
  // the run does not depend on the publisher threads' timing (the same flags, the same figures).
  std::vector<bool> live(n, true);
  for (bool any = true; any;) {
    any = false;
    for (uint32_t k = 0; k < n; ++k) {
      if (live[k]) live[k] = runs[k]->tick();
      if (store) managers[k]->manager().flush_shared();
      any = any || live[k];
    }
  }
  std::vector<SimCounters> counters;
  for (uint32_t k = 0; k < n; ++k) {
    counters.push_back(runs[k]->finish());
    if (!counters.back().error.empty())
      return fail("instance " + std::to_string(k) + ": " + counters.back().error);
  }
  for (auto& m : managers) {
    m->manager().synchronize();
    m->manager().flush_shared();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  const uint64_t bound = [&] {
    uint64_t b = 0;
    for (uint64_t v : reuse_bound(trace)) b += v;
    return b;
  }();
  const bool shared = serving.shared.store != nullptr;
  std::printf("fleet               %u instances, router %s, shared tier %s\n", n, o.router.c_str(),
              store ? (format_bytes(*quota) +
                       (o.backend == "none" ? " (modelled: none backend)" : " (in memory)"))
                          .c_str()
                    : (shared ? ("Redis " + o.shared_redis).c_str() : "none"));
  nlohmann::json j;
  j["settings"] = {{"model", o.model},
                   {"trace", o.trace},
                   {"backend", o.backend},
                   {"instances", n},
                   {"router", o.router},
                   {"gpu_quota", o.gpu_quota},
                   {"host_quota", o.host_quota},
                   {"shared_quota", o.shared_quota},
                   {"shared_redis", o.shared_redis},
                   {"tp", o.tp},
                   {"max_batch", o.max_batch}};
  j["per_instance"] = nlohmann::json::array();
  uint64_t reused = 0, prompt = 0;
  for (uint32_t k = 0; k < n; ++k) {
    const SimCounters& c = counters[k];
    reused += c.reused_tokens;
    prompt += c.prompt_tokens;
    std::printf("instance %-10u %zu requests, reused %llu of %llu prompt tokens (%.1f%%)", k,
                shares[k].size(), static_cast<ull>(c.reused_tokens),
                static_cast<ull>(c.prompt_tokens), percent(c.reused_tokens, c.prompt_tokens));
    nlohmann::json one = {{"requests", shares[k].size()},
                          {"requests_skipped", c.skipped},
                          {"prompt_tokens", c.prompt_tokens},
                          {"reused_tokens", c.reused_tokens},
                          {"reuse_bound_tokens", c.bound_tokens},
                          {"steps", c.steps},
                          {"bytes_offloaded", c.bytes_offloaded - c.bytes_offload_cancelled},
                          {"bytes_onboarded", c.bytes_onboarded}};
    if (shared) {
      const SharedTierStats st = managers[k]->manager().shared_stats();
      one["shared"] = shared_stats_json(st);
      one["shared_fetch_seconds"] = c.shared_fetch_us / 1e6;
      std::printf("; shared: %llu published, %llu fetched, %llu tokens brought in",
                  static_cast<ull>(st.objects_published), static_cast<ull>(st.objects_fetched),
                  static_cast<ull>(st.hit_tokens));
    }
    std::printf("\n");
    j["per_instance"].push_back(one);
  }
  std::printf(
      "fleet reuse         %llu of %llu prompt tokens (%.1f%%); bound %llu (%.1f%% of it)\n",
      static_cast<ull>(reused), static_cast<ull>(prompt), percent(reused, prompt),
      static_cast<ull>(bound), percent(reused, bound));
  j["reused_tokens"] = reused;
  j["prompt_tokens"] = prompt;
  j["reuse_bound_tokens"] = bound;
  if (store) {
    const StoreStats st = store->stats();
    std::printf("shared store        %s in %llu objects at the end; %llu evicted; %s put\n",
                format_bytes(store->bytes()).c_str(), static_cast<ull>(store->objects()),
                static_cast<ull>(store->evictions()), format_bytes(st.bytes_put).c_str());
    j["shared_store"] = {{"bytes", store->bytes()},
                         {"objects", store->objects()},
                         {"evictions", store->evictions()},
                         {"puts", st.puts},
                         {"gets", st.gets},
                         {"hits", st.hits}};
  }
  std::printf("wall time           %.1f s\n", seconds);
  j["wall_seconds"] = seconds;
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) return fail("--json: cannot write '" + o.json + "'");
    out << j.dump(2) << "\n";
    std::printf("JSON report         %s\n", o.json.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace hybridkv::tools
