// `hybridkv sim`: a serving-engine scheduler loop that drives the hybrid manager over a trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hybridkv::tools {

struct SimOptions {
  std::string model;
  std::string trace;
  uint64_t limit = 0;  // requests read from the trace (0: all of them)
  std::string gpu_quota = "40GiB";
  std::string host_quota;
  std::string disk_quota;
  std::string disk_path;
  uint32_t tp = 1;
  uint32_t pp = 1;       // pipeline-parallel size
  uint32_t pp_rank = 0;  // the pipeline rank simulated (its layers only)
  uint32_t max_batch = 64;
  uint64_t max_tokens_per_step = 8192;
  uint32_t tokens_per_block = 32;  // tokens per attention page
  // Tokens of GPU room freed ahead of each step while the GPU computes the one before
  // (HybridCacheManager::evict_ahead; 0: off): that time is off the step's critical path.
  uint64_t evict_ahead = 0;
  // "in-call" or "between-steps" (PolicyConfig::upkeep_between_steps: a dropped snapshot's
  // walks up the tree wait for evict_ahead).
  std::string upkeep = "in-call";
  // Pages the next resumption or admission onboards ahead of its step while the GPU computes
  // the one before (0: off): the next admission's request is created then (its match) and its
  // away pages come up in parts of at most this many (KvCache::prefetch), so that the resume
  // at the step finds them on the GPU. That time too is off the step's critical path.
  uint64_t admit_ahead = 0;
  // Pages a resumption or admission may bring up from a colder tier inside its step (0: no
  // limit). One with more away (KvCache::pages_away) waits while --admit-ahead brings them up
  // between steps, as an engine that loads KV asynchronously holds a request until its KV is
  // in: the step's work no longer grows with a prefix found on the host.
  uint64_t onboard_in_step = 0;
  // With --admit-ahead: how many of the next admissions' requests are created (their prompts
  // matched) while the GPU computes, each only while the one before it could resume.
  uint64_t create_ahead = 1;
  // Waiting requests nearest the head of the queue whose prefixes are touched while the GPU
  // computes (KvCacheManager::touch_reuse), each once as it comes that near (0: off). The
  // default is twice the default batch.
  uint64_t touch_queued = 128;
  // The step's commits (commit_at_snapshot of each prefill chunk) and the frees of the requests
  // it finished run after the step's last resize, i.e. after its launch, while the GPU computes
  // it, as an engine that schedules ahead runs them: off the step's critical path. Blocks a step
  // computes are matchable from the next step on, and a finished request's pages come back
  // after the step that computed its last token.
  bool after_launch = false;
  // Eager admission only: the next step's resumptions and admissions are made at the end of
  // this one, while the GPU computes it, as an engine that schedules a step ahead does (vLLM's
  // async scheduling, SGLang's overlap scheduler). They are the decisions the next step's start
  // would have made (nothing between the two changes the cache), so the run is the same; only
  // requests that arrive in between are admitted inside the step. That time is off the step's
  // critical path.
  bool schedule_ahead = false;
  std::string snapshot_policy = "periodic:512,aligned-end:512,branch,end,chunk";
  uint32_t spec_tokens = 0;
  std::string backend = "none";
  bool verify = false;
  bool attention_only = false;
  std::string arrival = "asap";  // asap | timestamps
  // eager: before each step, preempted requests resume and new ones are admitted up to
  // --max-batch. budget: as vLLM v1's scheduler, running requests take the step's token budget
  // first; then preempted and new requests join while tokens are left, each computing in the
  // step it joins, and none join in a step that preempted.
  std::string admission = "eager";
  uint64_t step_ms = 10;
  uint64_t typical_len = 8192;          // shapes the split between state and attention pools
  std::string rebalance = "on";         // on: the pool groups trade slots while serving
  std::string offload = "room";         // room: demoted pages are copied down only into free slots
  std::string colder_copies = "keep";   // keep: onboarded tree pages leave a copy below
  std::string eviction = "priced";      // or snapshot-aware, lru
  std::string snapshot_dtype = "fp32";  // or bf16, fp8 (reduced-precision snapshots)
  // GB/s down,up of the links into the host and disk tiers, for the bus time of tier moves
  // (defaults: measured on an H200 machine, bench/RESULTS.md 2026-11-30).
  std::string host_link_gbps = "52.2,50.9";
  std::string disk_link_gbps = "2.70,1.68";
  std::string json;
  std::string step_times;  // CSV: every step's manager CPU, by call
  std::string svg;
  std::string write_trace;  // the requests read, as Mooncake JSONL
  bool quiet = false;
  bool compare = false;  // also run --attention-only and print the share
  // The shared tier: a Redis at host:port (host or cuda backend); each new request is first
  // fetched from it (KvCacheManager::fetch_shared).
  std::string shared_redis;
  // "K/N": this process is instance K of N and serves the trace's requests with index % N == K
  // (several sim processes on one shared Redis make a fleet).
  std::string instance = "0/1";
  // A fleet in this process (sim_fleet.cc): N instances, each with the quotas above, the
  // trace's requests routed among them; --shared-quota: a shared tier of that many bytes in
  // memory (modelled with the none backend).
  uint32_t instances = 1;
  std::string router = "prefix";
  std::string shared_quota;
};

void add_sim_command(CLI::App& app, SimOptions& options);
int run_sim_command(const SimOptions& options);

}  // namespace hybridkv::tools
