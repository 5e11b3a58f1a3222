#include "sim.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <tuple>

#include "hybridkv/units.h"
#include "sim_internal.h"

namespace hybridkv::tools {

int fail(const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "hybridkv sim: %s\n", line.c_str());
  return 2;
}

namespace {

// The number after "name:" in a policy item.
Result<uint64_t> policy_number(const std::string& item, size_t colon) {
  Result<uint64_t> v = parse_count(std::string_view(item).substr(colon + 1));
  if (!v) return Status::invalid("--snapshot-policy: '" + item + "': " + v.status().message());
  return v;
}

Result<SnapshotPolicy> parse_policy(const std::string& text) {
  SnapshotPolicy p;  // the end of the prompt is always a snapshot point, unless "no-end"
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon);
    if (colon != std::string::npos &&
        (name == "periodic" || name == "aligned-end" || name == "start" || name == "from-end")) {
      Result<uint64_t> v = policy_number(item, colon);
      if (!v) return v.status();
      if (name == "periodic") p.periodic_interval = *v;
      if (name == "aligned-end") p.aligned_end = *v;
      if (name == "start") p.offsets_from_start.push_back(*v);
      if (name == "from-end") p.offsets_from_end.push_back(*v);
    } else if (item == "branch") {
      p.branch_point = true;
    } else if (item == "demand") {
      p.demand_driven = true;
    } else if (item == "end") {
      p.final_prompt_boundary = true;
    } else if (item == "no-end") {
      p.final_prompt_boundary = false;
    } else if (item == "answer") {
      p.answer_end = true;
    } else if (item == "chunk") {
      p.chunk_states = true;
    } else {
      return Status::invalid(
          "--snapshot-policy: '" + item +
          "' is not periodic:N, aligned-end:N, start:N, from-end:N, end, no-end, answer, branch, "
          "demand or chunk");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return p;
}

// Serving settings and backend from the flags.
Result<ServingConfig> serving_from(const SimOptions& o) {
  ServingConfig serving;
  serving.max_batch = o.max_batch;
  serving.pp_size = o.pp;
  serving.pp_rank = o.pp_rank;
  serving.num_spec_tokens = o.spec_tokens;
  serving.tokens_per_block = o.tokens_per_block;
  serving.typical_len = o.typical_len;
  if (o.rebalance != "on" && o.rebalance != "off")
    return Status::invalid("--rebalance: '" + o.rebalance + "' is not on or off");
  serving.policies.rebalance = o.rebalance == "on" ? "pressure" : "off";
  serving.policies.offload = o.offload;  // a name the manager does not know is refused by it
  if (o.colder_copies != "keep" && o.colder_copies != "drop")
    return Status::invalid("--colder-copies: '" + o.colder_copies + "' is not keep or drop");
  serving.policies.keep_colder_copies = o.colder_copies == "keep";
  serving.policies.eviction = o.eviction;
  if (o.upkeep != "in-call" && o.upkeep != "between-steps")
    return Status::invalid("--upkeep: '" + o.upkeep + "' is not in-call or between-steps");
  serving.policies.upkeep_between_steps = o.upkeep == "between-steps";
  if (o.snapshot_dtype == "bf16") {
    serving.snapshot_dtype = DType::kBF16;
  } else if (o.snapshot_dtype == "fp8") {
    serving.snapshot_dtype = DType::kFP8E4M3;
  } else if (o.snapshot_dtype != "fp32") {
    return Status::invalid("--snapshot-dtype: '" + o.snapshot_dtype + "' is not fp32, bf16 or fp8");
  }
  Result<SnapshotPolicy> policy = parse_policy(o.snapshot_policy);
  if (!policy) return policy.status();
  serving.snapshots = *policy;
  serving.tiers.clear();
  for (const auto& [flag, text, kind] :
       {std::tuple<const char*, std::string, TierKind>{"--gpu-quota", o.gpu_quota, TierKind::kGpu},
        {"--host-quota", o.host_quota, TierKind::kHost},
        {"--disk-quota", o.disk_quota, TierKind::kDisk}}) {
    if (text.empty() || (kind != TierKind::kGpu && text == "none")) continue;
    const Result<uint64_t> q = parse_byte_count(text);
    if (!q) return Status::invalid(std::string(flag) + ": " + q.status().message());
    serving.tiers.push_back({kind, *q, kind == TierKind::kDisk ? o.disk_path : ""});
  }
  if (o.max_batch == 0) return Status::invalid("--max-batch: 0 must be > 0");
  if (o.max_tokens_per_step == 0) return Status::invalid("--max-tokens-per-step: 0 must be > 0");
  if (o.arrival != "asap" && o.arrival != "timestamps")
    return Status::invalid("--arrival: '" + o.arrival + "' is not asap or timestamps");
  if (o.admission != "eager" && o.admission != "budget")
    return Status::invalid("--admission: '" + o.admission + "' is not eager or budget");
  if (o.create_ahead == 0) return Status::invalid("--create-ahead: 0 must be > 0");
  if (o.create_ahead > 1 && o.admit_ahead == 0)
    return Status::invalid("--create-ahead: " + std::to_string(o.create_ahead) +
                           " needs --admit-ahead > 0 (the requests are created with it)");
  if (o.schedule_ahead && o.admission != "eager")
    return Status::invalid("--schedule-ahead: needs --admission eager (with '" + o.admission +
                           "' new requests join inside the step, after its running requests)");
  if (o.onboard_in_step > 0 && o.admit_ahead == 0)
    return Status::invalid("--onboard-in-step: " + std::to_string(o.onboard_in_step) +
                           " needs --admit-ahead > 0 to bring the other pages up between steps");
  return serving;
}

// Everything that can be checked before memory is allocated or a request runs.
Status check_outputs_and_disk(const SimOptions& o) {
  for (const auto& [flag, text] :
       {std::pair<const char*, std::string>{"--host-link-gbps", o.host_link_gbps},
        {"--disk-link-gbps", o.disk_link_gbps}}) {
    if (Result<LinkRate> r = parse_link(flag, text); !r) return r.status();
  }
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--json", o.json},
                                   {"--svg", o.svg},
                                   {"--step-times", o.step_times},
                                   {"--write-trace", o.write_trace}}) {
    if (path.empty()) continue;
    if (std::filesystem::is_directory(path)) {
      return Status::invalid(std::string(flag) + ": '" + path + "' is a directory, not a file");
    }
    std::ofstream out(path, std::ios::app);
    if (!out) return Status::invalid(std::string(flag) + ": cannot write '" + path + "'");
  }
  const bool no_disk = o.disk_quota.empty() || o.disk_quota == "none";
  if (!o.disk_path.empty() && no_disk)
    return Status::invalid("--disk-path '" + o.disk_path + "' without --disk-quota");
  if (no_disk) return Status::ok();
  if (o.disk_path.empty()) return Status::invalid("--disk-quota needs --disk-path");
  if (!std::filesystem::is_directory(o.disk_path))
    return Status::invalid("--disk-path: '" + o.disk_path + "' is not an existing directory");
  if (access(o.disk_path.c_str(), W_OK) != 0)
    return Status::invalid("--disk-path: '" + o.disk_path + "' is not writable");
  return Status::ok();
}

Result<BackendOptions> backend_from(const SimOptions& o) {
  BackendOptions backend;
  if (o.backend == "none")
    backend.kind = BackendKind::kNone;
  else if (o.backend == "host")
    backend.kind = BackendKind::kHost;
  else if (o.backend == "cuda")
    backend.kind = BackendKind::kCuda;
  else
    return Status::invalid("--backend: '" + o.backend + "' is not none, host or cuda");
  if (o.verify && backend.kind == BackendKind::kNone)
    return Status::invalid("--verify needs --backend host or cuda (the none backend has no bytes)");
  return backend;
}

// The model, less its recurrent layers with --attention-only.
Result<ModelDescription> model_from(const SimOptions& o) {
  if (o.tp == 0) return Status::invalid("--tp: 0 must be > 0");
  ModelOptions mo;
  mo.tp_size = o.tp;
  Result<ModelDescription> model = read_model_config(o.model, mo);
  if (!model || !o.attention_only) return model;
  // Same trace, same byte budget, no recurrent layers: the cost of hybrid state on reuse.
  std::vector<ModelLayer> kept;
  for (const ModelLayer& l : model->layers) {
    if (l.is_attention()) kept.push_back(l);
  }
  if (kept.empty()) return Status::invalid("--attention-only: the model has no attention layers");
  for (size_t i = 0; i < kept.size(); ++i) kept[i].cache_layer = static_cast<LayerId>(i);
  model->layers = kept;
  return model;
}

// Whether the GPU quota holds the floors of `serving` with max_seq_len = len.
bool floors_fit(const ModelDescription& model, ServingConfig serving, uint64_t len) {
  serving.max_seq_len = len;
  Result<ManagerConfig> config = hybrid_manager_config(model, serving);
  if (!config) return false;
  Result<uint64_t> minimum = minimum_gpu_quota(*config);
  return minimum && !serving.tiers.empty() && *minimum <= serving.tiers.front().quota_bytes;
}

// With rebalancing the GPU keeps room for the longest request the sim admits (the trace's
// longest, capped by what the starting plan holds: longer ones are skipped), so that no pool
// group shrinks under it. That room is a floor of its own: it is capped where the quota still
// holds every floor, so that a larger quota is never refused where a smaller one ran.
Result<std::unique_ptr<HybridCacheManager>> create_manager(const ModelDescription& model,
                                                           ServingConfig serving,
                                                           const BackendOptions& backend,
                                                           const std::vector<TraceRequest>& trace) {
  if (serving.policies.rebalancing()) {
    Result<ManagerConfig> config = hybrid_manager_config(model, serving);
    if (!config) return config.status();
    Result<StoragePlan> plan = StoragePlan::build(*config);
    if (!plan) return plan.status();
    uint64_t longest = 0;
    for (const TraceRequest& t : trace)
      longest = std::max(longest, t.input_length + t.output_length);
    longest = std::min(longest, plan->max_request_tokens().value_or(longest));
    if (longest > 0 && !floors_fit(model, serving, longest)) {
      uint64_t lo = 0, hi = longest;  // floors fit at lo (or lo == 0: none), not at hi
      while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        (floors_fit(model, serving, mid) ? lo : hi) = mid;
      }
      longest = lo;
    }
    if (longest > 0) serving.max_seq_len = longest;
  }
  return HybridCacheManager::create(model, serving, backend);
}

// --compare: the same trace and quotas with the recurrent layers dropped (none backend), and
// the share of its reuse that the hybrid run reached: the figure hybrid reuse is judged by.
int compare_attention_only(const SimOptions& o, const std::vector<TraceRequest>& trace,
                           const std::vector<uint64_t>& bound, uint64_t hybrid_reused) {
  SimOptions a = o;
  a.attention_only = true;
  a.backend = "none";
  a.verify = false;
  a.quiet = true;
  Result<ServingConfig> serving = serving_from(a);
  Result<ModelDescription> model = model_from(a);
  if (!serving || !model) return fail("--compare: the attention-only model cannot be built");
  Result<BackendOptions> backend = backend_from(a);
  Result<std::unique_ptr<HybridCacheManager>> created =
      create_manager(*model, *serving, *backend, trace);
  if (!created) return fail("--compare: " + created.status().message());
  const SimCounters c = run_scheduler(a, trace, bound, **created, nullptr);
  if (!c.error.empty()) return fail("--compare: " + c.error);
  std::printf(
      "vs attention-only  %.3f of the %llu tokens the same model without its recurrent layers "
      "reuses at the same bytes (hybrid: %llu)\n",
      c.reused_tokens ? static_cast<double>(hybrid_reused) / c.reused_tokens : 0.0,
      static_cast<unsigned long long>(c.reused_tokens),
      static_cast<unsigned long long>(hybrid_reused));
  std::fflush(stdout);
  return 0;
}

}  // namespace

Result<LinkRate> parse_link(const char* flag, const std::string& text) {
  LinkRate r;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lf,%lf%c", &r.down, &r.up, &tail) != 2 || !(r.down > 0) ||
      !(r.up > 0)) {
    return Status::invalid(std::string(flag) + ": '" + text +
                           "' is not DOWN,UP (GB/s, both above 0)");
  }
  return r;
}

void add_sim_command(CLI::App& app, SimOptions& o) {
  CLI::App* sim = app.add_subcommand("sim", "Replay a request trace through the cache");
  sim->add_option("--model", o.model, "HuggingFace config.json of the model")->required();
  sim->add_option("--trace", o.trace, "Mooncake JSONL trace, or synthetic:N[:SEED]")->required();
  sim->add_option("--limit", o.limit, "read at most this many requests (0: all of them)");
  sim->add_option("--gpu-quota", o.gpu_quota, "GPU cache quota");
  sim->add_option("--host-quota", o.host_quota, "host tier quota (none: no host tier)");
  sim->add_option("--disk-quota", o.disk_quota,
                  "disk tier quota (none: no disk tier; none backend only; needs --disk-path)");
  sim->add_option("--disk-path", o.disk_path, "an existing, writable directory for the disk tier");
  sim->add_option("--tp", o.tp, "tensor-parallel size");
  sim->add_option("--pp", o.pp, "pipeline-parallel size");
  sim->add_option("--pp-rank", o.pp_rank,
                  "the pipeline rank simulated (its layers; every rank sees the same trace)");
  sim->add_option("--max-batch", o.max_batch, "requests per step");
  sim->add_option("--max-tokens-per-step", o.max_tokens_per_step, "token budget per step");
  sim->add_option("--tokens-per-block", o.tokens_per_block, "tokens per attention page");
  sim->add_option("--evict-ahead", o.evict_ahead,
                  "tokens of GPU room freed ahead of each step while the GPU computes (0: off; "
                  "the report times it apart from the step)");
  sim->add_option("--upkeep", o.upkeep,
                  "in-call: a snapshot dropped to make room does its walks up the tree at once; "
                  "between-steps: they wait for the next --evict-ahead (at most 64 wait)");
  sim->add_option("--admit-ahead", o.admit_ahead,
                  "pages the next resumption or admission onboards ahead of each step while the "
                  "GPU computes (its request created then; 0: off; timed apart from the step)");
  sim->add_option("--onboard-in-step", o.onboard_in_step,
                  "pages a resumption or admission may bring up from a colder tier inside its "
                  "step (0: no limit); one with more waits while --admit-ahead brings them up");
  sim->add_option("--create-ahead", o.create_ahead,
                  "with --admit-ahead: the next admissions whose requests are created (prompt "
                  "matched) while the GPU computes, each while the one before could resume");
  sim->add_option("--touch-queued", o.touch_queued,
                  "waiting requests nearest the head of the queue whose reusable prefixes move to "
                  "the back of the eviction order while the GPU computes, each once (0: off; "
                  "timed apart from the step)");
  sim->add_flag("--after-launch", o.after_launch,
                "commit the step's prefill chunks and free the requests it finished after its "
                "launch, while the GPU computes (timed apart from the step)");
  sim->add_flag("--schedule-ahead", o.schedule_ahead,
                "eager admission: make the next step's resumptions and admissions while the GPU "
                "computes this one, as an engine that schedules a step ahead (the same run; "
                "timed apart from the step)");
  sim->add_option(
      "--snapshot-policy", o.snapshot_policy,
      "comma list: periodic:N, aligned-end:N, start:N, from-end:N, end, no-end, answer, "
      "branch, demand, chunk (the kernel writes the states of periodic points inside a "
      "prefill chunk: they end no chunk)");
  sim->add_option("--spec-tokens", o.spec_tokens, "speculative tokens (replay buffers)");
  sim->add_option("--backend", o.backend,
                  "none (metadata only, any scale), host (real bytes in host memory) or cuda "
                  "(GPU tier on the GPU, host tier pinned)");
  sim->add_flag("--verify", o.verify,
                "check every page through the fake engine (host or cuda backend)");
  sim->add_flag("--attention-only", o.attention_only, "drop the recurrent layers");
  sim->add_option("--arrival", o.arrival, "asap or timestamps");
  sim->add_option("--admission", o.admission,
                  "eager: requests join before the step, up to --max-batch; budget: as vLLM "
                  "v1, after the running requests, while the step's token budget lasts (none "
                  "in a step that preempted)");
  sim->add_option("--host-link-gbps", o.host_link_gbps,
                  "GB/s of pages going to and coming from the host tier, for the bus time "
                  "(default: measured on an H200 machine)");
  sim->add_option("--disk-link-gbps", o.disk_link_gbps,
                  "GB/s of pages going to and coming from the disk tier, for the bus time "
                  "(default: measured on an H200 machine's local disk)");
  sim->add_option("--step-ms", o.step_ms, "simulated milliseconds per step (timestamps)");
  sim->add_option("--typical-len", o.typical_len,
                  "tokens per request of the typical step that shapes the starting pool split");
  sim->add_option("--rebalance", o.rebalance,
                  "on: pool groups trade slots while serving (one budget); off: fixed split");
  sim->add_option("--shared-redis", o.shared_redis,
                  "host:port of a Redis as the shared tier (host or cuda backend): committed "
                  "blocks and snapshots are published to it, new requests fetched from it");
  sim->add_option("--instance", o.instance,
                  "K/N: serve the requests with index % N == K (several sims on one "
                  "--shared-redis make a fleet)");
  sim->add_option("--instances", o.instances,
                  "N: a fleet of N instances in this process, each with the quotas given, the "
                  "requests routed among them (--router)");
  sim->add_option("--router", o.router,
                  "random, or prefix: to the instance sent the longest prefix of the prompt when "
                  "it covers half of it, else the least loaded");
  sim->add_option("--shared-quota", o.shared_quota,
                  "a tier shared by the fleet's instances, of this many bytes, in memory "
                  "(least recently used evicted; modelled with the none backend)");
  sim->add_option("--offload", o.offload,
                  "room: evicted pages worth nothing to a hybrid request (demoted) are copied down "
                  "a tier only into a free slot, else dropped; selective: they are always "
                  "dropped; all: every evicted page that fits below is copied");
  sim->add_option("--colder-copies", o.colder_copies,
                  "keep: a tree page brought up from a colder tier leaves its bytes there as a "
                  "copy (the tier's first victim), so evicting it again moves nothing; drop: "
                  "the colder slot is freed and a later eviction copies the page down again");
  sim->add_option("--eviction", o.eviction,
                  "priced: snapshot-aware, and snapshots age as fast as they are cheap (tokens "
                  "saved per byte); snapshot-aware: pages no request can resume from go first; "
                  "lru: plain LRU");
  sim->add_option("--snapshot-dtype", o.snapshot_dtype,
                  "fp32; bf16: snapshots keep fp32 states in bf16 (half the bytes); fp8: in "
                  "e4m3 blocks of 128 values with a power-of-two scale (129 bytes per 512)");
  sim->add_option("--json", o.json, "write the report as JSON");
  sim->add_option("--svg", o.svg, "write a plot of reuse and memory over time");
  sim->add_option(
      "--step-times", o.step_times,
      "write every step's manager CPU time, by call, as CSV (the worst steps' profile)");
  sim->add_option("--write-trace", o.write_trace,
                  "write the requests read (e.g. a synthetic trace) as Mooncake JSONL");
  sim->add_flag("--quiet", o.quiet, "no progress output");
  sim->add_flag("--compare", o.compare,
                "also run --attention-only (none backend, same quotas) and print the share of "
                "its reuse this run reached");
}

int run_sim_command(const SimOptions& o) {
  if (Status s = check_outputs_and_disk(o); !s) return fail(s.message());
  if (Status s = check_fleet_options(o); !s) return fail(s.message());
  Result<ServingConfig> serving = serving_from(o);
  if (!serving) return fail(serving.status().message());
  if (Status s = add_shared_tier(o, *serving); !s) return fail(s.message());
  const Result<std::pair<uint32_t, uint32_t>> instance = parse_instance(o.instance);
  if (!instance) return fail(instance.status().message());
  Result<BackendOptions> backend = backend_from(o);
  if (!backend) return fail(backend.status().message());
  Result<ModelDescription> model = model_from(o);
  if (!model) return fail(model.status().message());
  Result<std::vector<TraceRequest>> trace = o.trace.rfind("synthetic:", 0) == 0
                                                ? synthetic_trace(o.trace, o.limit)
                                                : read_mooncake_trace(o.trace, o.limit);
  if (!trace) return fail(trace.status().message());
  if (instance->second > 1) *trace = instance_share(*trace, instance->first, instance->second);
  if (!o.write_trace.empty()) {
    if (Status s = write_mooncake_trace(*trace, o.write_trace); !s)
      return fail("--write-trace: " + s.message());
  }
  if (o.instances > 1) {
    return run_fleet(o, *serving, *trace,
                     [&](const ServingConfig& s, const std::vector<TraceRequest>& share) {
                       return create_manager(*model, s, *backend, share);
                     });
  }
  Result<std::unique_ptr<HybridCacheManager>> created =
      create_manager(*model, *serving, *backend, *trace);
  if (!created) return fail(created.status().message());
  HybridCacheManager& h = **created;
  std::unique_ptr<testing::FakeEngine> engine;
  if (o.verify) {
    engine = std::make_unique<testing::FakeEngine>(h.manager());
    // Real-size states: write and check 16 bytes at each end of every token region and state
    // (a page in the wrong slot, stale or overwritten still shows at its first bytes).
    engine->set_sampled_writes(16);
    engine->set_sampled_check(16);
  }
  const std::vector<uint64_t> bound = reuse_bound(*trace);
  const auto started = std::chrono::steady_clock::now();
  const SimCounters counters = run_scheduler(o, *trace, bound, h, engine.get());
  if (!counters.error.empty()) return fail(counters.error);
  // The wall time includes draining queued copies (the host backend's worker may lag).
  if (!o.quiet) std::fprintf(stderr, "sim: waiting for the queued page copies to finish\n");
  h.manager().synchronize();
  h.manager().flush_shared();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const int rc = report(o, *model, *trace, h, counters, engine.get(), seconds);
  if (rc != 0 || !o.compare || o.attention_only) return rc;
  return compare_attention_only(o, *trace, bound, counters.reused_tokens);
}

}  // namespace hybridkv::tools
