// The engine-facing layer for hybrid models (DESIGN §7).
//
// hybrid_manager_config() turns a model description and serving settings into a ManagerConfig
// for one pipeline-parallel rank: the rank's contiguous share of the base layers (speculative
// MTP layers on the last rank), each recurrent layer's state and conv buffers, and, with
// speculative decoding, the family's replay buffers: PRIVATE (own group, own slot, own index)
// or coupled (REQUIRED, same slot and index as the state, carried by snapshots). Living caches
// are bounded by N = max_batch x pp x (2 with overlap scheduling or disaggregation) + dummy
// slots + 1, which also sizes the fixed PRIVATE replay pool: replay bytes are a fixed intercept.
//
// HybridCacheManager maps request ids to caches, hands out per-step state and replay indices
// and the replay pages to reset (a request's first replay page, dummies included; the mark is
// cleared when the request is freed or its state dropped for re-prefill, not by suspend), plans
// where snapshots are taken, and scans buffers for NaN/Inf.
//
// Thread-safety: HybridCacheManager is driven by one scheduler thread; the KvCacheManager under
// it is thread-safe. Cost: prepare_step is O(requests in the step + their blocks).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hybridkv/manager.h"
#include "hybridkv/model.h"

namespace hybridkv {

enum class DisaggRole : uint8_t { kBoth, kContext, kGeneration };
enum class ReplayLayout : uint8_t {
  kPrivate,  // every family: own PRIVATE group, own slot, own index
  kRing,     // GDN only (FlashInfer ring): k_ring, u_ring, g_ring coupled to the state slot
};
const char* replay_layout_name(ReplayLayout layout);

// Where snapshots are taken (DESIGN §7). The engine asks next_snapshot_point() and ends its
// prefill chunks there; commits happen only at snapshot points.
struct SnapshotPolicy {
  std::optional<uint64_t> periodic_interval;  // every k tokens
  // The last multiple of N inside the prompt (for traffic that shares prefixes in blocks of N
  // tokens: a later prompt repeats this one's whole blocks, not its partial last one).
  std::optional<uint64_t> aligned_end;
  std::vector<uint64_t> offsets_from_start;  // at these prompt positions
  std::vector<uint64_t> offsets_from_end;    // at prompt_len - offset
  bool final_prompt_boundary = true;         // at the end of the prompt
  bool branch_point = false;                 // where the prompt leaves the tree
  bool demand_driven = false;                // where lookups found attention reuse past the
                                             // last snapshot
  // At the request's end, the prompt and the generated answer (chat: the next turn repeats
  // both) are committed with a snapshot there: the engine calls commit_answer() before
  // free_request().
  bool answer_end = false;
  // The engine's kernel writes the state at periodic points inside a prefill chunk
  // (reserve_chunk_states): they no longer end chunks, and each becomes a speculative snapshot.
  bool chunk_states = false;
};

// A state the kernel writes inside the coming prefill chunk (reserve_chunk_states).
struct ChunkState {
  uint64_t point = 0;       // the state after this many tokens of the prompt
  int32_t state_index = 0;  // the GPU slot of the state group's pages to write it into
};

struct ServingConfig {
  // --- parallelism and scheduling ---
  uint32_t max_batch = 64;  // requests per step on this rank
  uint32_t pp_size = 1;     // pipeline-parallel ranks
  uint32_t pp_rank = 0;
  bool overlap_scheduling = false;  // doubles the living caches
  DisaggRole role = DisaggRole::kBoth;
  uint32_t dummy_slots = 0;            // CUDA-graph padding requests kept alive
  std::optional<uint32_t> mtp_layers;  // unset: the config's num_nextn_predict_layers
  // --- speculative decoding ---
  uint32_t num_spec_tokens = 0;  // 0: no replay buffers
  ReplayLayout replay_layout = ReplayLayout::kPrivate;
  // --- cache ---
  uint32_t tokens_per_block = 32;
  std::vector<TierConfig> tiers = {{TierKind::kGpu, 16ull << 30, ""}};
  double max_util_for_resume = 0.97;
  bool enable_block_reuse = true;
  bool enable_partial_reuse = true;  // a match may end inside a block (its tail is copied)
  uint64_t typical_len = 2048;       // tokens per request of the typical step (pool ratio)
  // The longest request the engine admits: the GPU always keeps room for one of them (a
  // constraint), also while rebalancing moves slots between pool groups.
  std::optional<uint64_t> max_seq_len;
  // Eviction, offload, kept copies, rebalancing; offload "room": speculative snapshots (and
  // superseded ones) go down a tier while it has a free slot.
  PolicyConfig policies{.offload = "room"};
  std::optional<DType> snapshot_dtype;  // ManagerConfig::snapshot_dtype (reduced precision)
  bool record_events = false;           // ManagerConfig::record_events (tree events)
  SnapshotPolicy snapshots;
  SharedTierConfig shared;  // ManagerConfig::shared (the tier shared by serving instances)
};

// N = max_batch x pp_size x (2 with overlap scheduling or disaggregation) + dummy_slots + 1.
uint64_t max_live_caches(const ServingConfig& serving);

// The manager config of one rank. Errors name the serving field and value.
Result<ManagerConfig> hybrid_manager_config(const ModelDescription& model,
                                            const ServingConfig& serving);

// Where a non-finite value sits.
struct NonFiniteReport {
  LayerId layer = 0;
  std::string role;
  uint32_t slot = 0;     // GPU slot of the page
  uint64_t element = 0;  // index within the page
  std::optional<uint64_t> request_id;
  uint32_t rank = 0;  // the tensor-parallel rank whose memory holds it
};

class HybridCacheManager {
 public:
  static Result<std::unique_ptr<HybridCacheManager>> create(const ModelDescription& model,
                                                            const ServingConfig& serving,
                                                            const BackendOptions& backend = {});
  // From a manager config the caller derived from hybrid_manager_config() and adjusted.
  static Result<std::unique_ptr<HybridCacheManager>> create(const ManagerConfig& config,
                                                            const ServingConfig& serving,
                                                            const BackendOptions& backend = {});
  ~HybridCacheManager();

  KvCacheManager& manager() { return *manager_; }
  const StoragePlan& plan() const { return manager_->plan(); }
  const ServingConfig& serving() const { return serving_; }
  // The REQUIRED SSM group (nullopt on a rank without recurrent layers).
  std::optional<CacheGroupId> state_group() const { return state_group_; }
  // The group whose slot holds replay state (the state group itself when coupled).
  std::optional<CacheGroupId> replay_group() const { return replay_group_; }

  // --- requests ---
  // A new request: a SUSPENDED cache that already holds what the prefix tree offers. `keys`:
  // the prompt's block keys computed ahead (manager().hash_prompt, e.g. when the request
  // arrived), so that neither this call nor the prompt's commits hash it.
  Status add_request(uint64_t request_id, std::span<const int32_t> prompt, ReuseScope scope = {},
                     std::shared_ptr<const PromptKeys> keys = nullptr);
  // The same, the prompt moved into the cache instead of copied (a long prompt is hundreds of
  // KB, copied on the step that admits it). On an error `prompt` is left as it was.
  Status add_request(uint64_t request_id, std::vector<int32_t>&& prompt, ReuseScope scope = {},
                     std::shared_ptr<const PromptKeys> keys = nullptr);
  Status resume(uint64_t request_id);
  Status suspend(uint64_t request_id);
  Status resize(uint64_t request_id, uint64_t capacity, uint64_t history);
  // One decode step's growth: every request grows by one token (resize to history + 1,
  // history unchanged) as one operation: a request listed twice, unknown or not ACTIVE, or too
  // little room for all of them, and nothing changed (KvCacheManager::resize_all).
  Status decode_step(std::span<const uint64_t> request_ids);
  // The request comes back as a context request: its state is dropped (a new cache, matched
  // against the tree again) and its replay state starts from reset.
  Status reprefill(uint64_t request_id);
  // Frees everything the request holds; committed pages stay in the tree.
  Status free_request(uint64_t request_id);
  KvCache* cache(uint64_t request_id);
  size_t num_requests() const;

  // --- snapshots ---
  // The next position after the request's history where a snapshot is taken (the engine ends
  // its prefill chunk there); the prompt length when none comes earlier.
  Result<uint64_t> next_snapshot_point(uint64_t request_id) const;
  // Commits the prompt's tokens [committed, history): with the SSM states when history is a
  // snapshot point, else the KV of its full blocks only (KV is published whether or not a
  // snapshot is taken; the policy decides only where states are copied).
  Status commit_at_snapshot(uint64_t request_id);
  // With SnapshotPolicy::chunk_states: reserves the states of the policy's periodic points
  // inside the prefill chunk that ends at `upto` (after resize, before the step), as many as
  // cost no page of value (KvCache::reserve_states); the kernel writes each after its point's
  // tokens, and commit_at_snapshot publishes them as speculative snapshots. Empty otherwise.
  Result<std::vector<ChunkState>> reserve_chunk_states(uint64_t request_id, uint64_t upto);
  // Commits the rest of the prompt and the generated tokens the cache has computed
  // ([committed, history) of prompt + generated), with the SSM states at history: the point a
  // chat's next turn resumes from. Requires: the prompt computed (kFailedPrecondition) and
  // `generated` covering history (kInvalidArgument). Nothing to do when history is committed.
  Status commit_answer(uint64_t request_id, std::span<const int32_t> generated);

  // --- per step ---
  struct StepEntry {
    std::optional<uint64_t> request_id;  // nullopt: a dummy (CUDA-graph padding)
    int32_t state_index = kBadPageIndex;
    int32_t replay_index = kBadPageIndex;  // equals state_index when coupled
  };
  struct Step {
    std::vector<StepEntry> entries;      // requests, then dummies
    std::vector<int32_t> replay_resets;  // replay indices whose replay state must be reset
    // Memory the engine owns (BackendKind::kEngine): the copies to run before the step's
    // kernels read its pages, then report done (KvCacheManager::copies_done); empty otherwise.
    std::vector<EngineCopyBatch> copies;
  };
  // Evicts ahead of the next step (KvCacheManager::evict_ahead) while the GPU computes this
  // one: free GPU slots for `step_tokens` new tokens in every attention group, at most 1/8 of
  // a pool group's planned slots. Returns the pages evicted.
  Result<uint64_t> evict_ahead(uint64_t step_tokens);
  // Requires: every request ACTIVE and listed once; num_dummies <= dummy_slots.
  Result<Step> prepare_step(std::span<const uint64_t> request_ids, uint32_t num_dummies);

  // Zeroes the replay buffers of the step's replay_resets (one batched kernel on `stream` with
  // the CUDA backend). An engine that resets them itself need not call it.
  // With several ranks, once per rank (`rank`'s buffers, on its stream).
  void reset_replay(const Step& step, Stream stream = {}, uint32_t rank = 0);

  // --- step buffers at fixed addresses ---
  // A step's index buffers, sized once for the largest step the serving config allows:
  // `capacity` = max_batch + dummy_slots entries, block tables of every group that has them
  // (table_groups, in order) `max_blocks` wide = ceil(max_seq_len / tokens_per_block) (without
  // max_seq_len: the longest request the GPU tier can hold). In GPU memory with the cuda
  // backend, so a CUDA graph can capture the kernels that read them; host memory otherwise.
  // The addresses never change while the manager lives; fill_step() rewrites the contents, so
  // a step's values are read between its fill_step and the next. Entry e's row of table group
  // k starts at block_tables + e * row_stride + k * max_blocks; -1 marks what is not in use
  // (blocks past a request's end, entries past the step).
  struct StepBuffers {
    const int32_t* state_indices = nullptr;   // [capacity]
    const int32_t* replay_indices = nullptr;  // [capacity]
    const int32_t* block_tables = nullptr;    // [capacity][table_groups][max_blocks]
    uint32_t capacity = 0;
    uint32_t max_blocks = 0;
    uint64_t row_stride = 0;  // table_groups.size() * max_blocks
    std::vector<CacheGroupId> table_groups;
    bool on_device = false;
  };
  // Allocated on the first call, then fixed. With several ranks (BackendOptions::devices) each
  // rank has its own, on its device, holding the same values.
  Result<const StepBuffers*> step_buffers(uint32_t rank = 0);
  // Writes `step` (prepare_step's, before any other change to its requests) into the step
  // buffers: the CPU writes pinned staging, then one copy ordered on `stream` (the previous
  // fill's copy is waited for first). More entries than capacity, or a block table wider than
  // max_blocks, is an error naming the request, and nothing is written.
  // With several ranks, once per rank, each on its own stream.
  Status fill_step(const Step& step, Stream stream = {}, uint32_t rank = 0);

  // --- diagnostics ---
  // Scans pages by declared dtype for NaN/Inf: one request's, or every living cache's (one
  // batched kernel with the CUDA backend).
  std::vector<NonFiniteReport> scan_non_finite(std::optional<uint64_t> request_id = {}) const;

 private:
  struct Request;    // one request's cache and prompt (hybrid_manager.cc)
  struct Requests;   // requests by id
  struct StepState;  // the step buffers' memory (step_buffers.cc)
  HybridCacheManager() = default;
  Status lookup(uint64_t request_id, Request** out);
  // Each id once, known and ACTIVE; errors name `op` and the request.
  Status check_step_ids(const char* op, std::span<const uint64_t> request_ids);
  uint64_t next_policy_point(const Request& request, uint64_t after, bool kept_only = false) const;
  SnapshotRole snapshot_role(const Request& request, uint64_t at) const;

  ServingConfig serving_;
  std::unique_ptr<KvCacheManager> manager_;
  std::optional<CacheGroupId> state_group_;
  std::optional<CacheGroupId> replay_group_;
  std::unique_ptr<Requests> requests_;
  std::vector<std::unique_ptr<KvCache>> dummies_;
  std::vector<bool> dummy_reset_pending_;
  std::vector<std::unique_ptr<StepState>> step_states_;  // by rank
};

}  // namespace hybridkv
