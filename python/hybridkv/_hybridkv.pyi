from collections.abc import Sequence
import enum
from typing import overload



class AttentionLayerConfig:
    """An attention layer (full or sliding window)."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def id(self) -> int: ...

    @id.setter
    def id(self, arg: int, /) -> None: ...

    @property
    def window(self) -> int | None: ...

    @window.setter
    def window(self, arg: int, /) -> None: ...

    @property
    def sink_tokens(self) -> int | None: ...

    @sink_tokens.setter
    def sink_tokens(self, arg: int, /) -> None: ...

    @property
    def reuse_policy(self) -> ReusePolicy: ...

    @reuse_policy.setter
    def reuse_policy(self, arg: ReusePolicy, /) -> None: ...

    @property
    def buffers(self) -> list[BufferConfig]: ...

    @buffers.setter
    def buffers(self, arg: Sequence[BufferConfig], /) -> None: ...

class BackendKind(enum.Enum):
    NONE = 0

    HOST = 1

    CUDA = 2

    ENGINE = 3

class BatchShape:
    """Requests that run in one step (and a shared system prompt)."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def requests(self) -> list[RequestShape]: ...

    @requests.setter
    def requests(self, arg: Sequence[RequestShape], /) -> None: ...

    @property
    def shared_prefix_tokens(self) -> int | None: ...

    @shared_prefix_tokens.setter
    def shared_prefix_tokens(self, arg: int, /) -> None: ...

class BlockHash(enum.Enum):
    SHA256 = 0

    FAST_NON_CRYPTOGRAPHIC = 1

class BufferConfig:
    """One buffer of a layer, bytes per page."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def role(self) -> str: ...

    @role.setter
    def role(self, arg: str, /) -> None: ...

    @property
    def bytes_per_page(self) -> int: ...

    @bytes_per_page.setter
    def bytes_per_page(self, arg: int, /) -> None: ...

    @property
    def reuse_policy(self) -> ReusePolicy | None: ...

    @reuse_policy.setter
    def reuse_policy(self, arg: ReusePolicy, /) -> None: ...

    @property
    def dtype(self) -> DType | None: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

class CacheState(enum.Enum):
    SUSPENDED = 0

    ACTIVE = 1

    CLOSED = 2

class DType(enum.Enum):
    F32 = 0

    F16 = 1

    BF16 = 2

    FP8_E4M3 = 3

    FP8_E5M2 = 4

    INT8 = 5

    UINT8 = 6

class DisaggRole(enum.Enum):
    BOTH = 0

    CONTEXT = 1

    GENERATION = 2

class HybridCacheManager:
    """Requests of a hybrid model on one rank (hybridkv/hybrid.h)."""

    def __init__(self, model: ModelDescription, serving: ServingConfig, backend: BackendKind = BackendKind.HOST, device: int = 0, devices: Sequence[int] = []) -> None:
        """
        devices: one tensor-parallel rank per entry, each rank's pools on that CUDA device (HOST: ranks in host memory); one set of tables for all ranks. Empty: one rank on `device`.
        """

    @property
    def ranks(self) -> int:
        """Tensor-parallel ranks whose pools it holds."""

    def add_request(self, request_id: int, prompt: Sequence[int]) -> None:
        """A new request, SUSPENDED, holding what the tree offers."""

    def resume(self, request_id: int) -> None:
        """
        Makes a SUSPENDED request ACTIVE (pages back on the GPU; RefusedError at the resume gate, OutOfPagesError without room).
        """

    def suspend(self, request_id: int) -> None:
        """
        Makes an ACTIVE request SUSPENDED: its pages stay, and may move to a colder tier.
        """

    def resize(self, request_id: int, capacity: int, history: int) -> None:
        """
        Tokens the next step computes up to (capacity) and tokens computed (history); OutOfPagesError changes nothing.
        """

    def reprefill(self, request_id: int) -> None:
        """
        The request comes back as a context request: state dropped, matched against the tree again.
        """

    def free_request(self, request_id: int) -> None:
        """
        Frees everything the request holds; committed pages stay in the prefix tree.
        """

    def request(self, request_id: int) -> dict:
        """history, capacity, reused tokens and state of a request"""

    def next_snapshot_point(self, request_id: int) -> int:
        """
        Where the request's next prefill chunk should end (the snapshot policy; the prompt's end at most).
        """

    def reserve_chunk_states(self, request_id: int, upto: int) -> list[tuple[int, int]]:
        """
        SnapshotPolicy.chunk_states: after resize, before the step, the states the kernel writes inside the chunk ending at upto, as (point, state_index) pairs: the state after point tokens goes into GPU slot state_index of the state group. commit_at_snapshot publishes them. Empty when the policy has no chunk states.
        """

    def commit_at_snapshot(self, request_id: int) -> None:
        """
        Publishes the prompt's computed tokens; states only at snapshot points.
        """

    def commit_answer(self, request_id: int, generated: Sequence[int]) -> None:
        """
        Publishes the rest of the prompt and the generated tokens, with a snapshot at history (chat).
        """

    def buffer_view(self, tier: TierKind, layer: int, role: str, rank: int = 0) -> object:
        """
        One buffer of one layer as a numpy array [slots, elements] over the manager's memory (rank `rank`'s; row = slot index; bf16 shows as uint16).
        """

    def state_index(self, request_id: int, group: int | None = None, beam: int = 0) -> int:
        """
        The GPU slot of an ACTIVE request's recurrent state (row of buffer_view's 'ssm_state' / 'conv_state'); `group` defaults to the state group.
        """

    def buffer_group(self, layer: int, role: str) -> int:
        """The cache group that holds one buffer (its block tables)."""

    def block_table(self, request_id: int, group: int, beam: int = 0) -> list[int]:
        """
        A copy of the request's block table for a cache group (per-step handoff: decode_step).
        """

    def decode_step(self, request_ids: object, group: int | None = None) -> tuple:
        """
        One decode step for a batch, all or nothing: every request grows by one token. request_ids: a 1-D uint64 array or a list of ints, each request once and ACTIVE (else an error naming the request, and nothing changed). Returns numpy arrays of this step (state indices, replay indices, block tables of `group` [requests, blocks], -1 past a request's blocks) that own their memory: later steps leave them as they are.
        """

    def step_buffers(self, rank: int = 0) -> tuple:
        """
        Rank `rank`'s copy of the step's index buffers at fixed addresses, sized once for max_batch + dummy_slots entries and max_seq_len / tokens_per_block blocks: (state indices, replay indices, block tables [entries, table groups, max_blocks], the table groups). On the GPU with the cuda backend (DLPack capsules, each consumed once by torch.from_dlpack; a CUDA graph can capture kernels that read them), numpy otherwise. fill_step() rewrites them; -1 marks what is not in use.
        """

    def fill_step(self, request_ids: object, num_dummies: int = 0, stream: int = 0, streams: Sequence[int] = []) -> list[int]:
        """
        Writes one step (every request ACTIVE, listed once; then num_dummies dummies) into every rank's step_buffers() with one copy each, ordered on `stream` (a cudaStream_t as an int; 0: the default stream) or on streams[rank] (one per rank). Returns the replay indices to reset before the step.
        """

    def pool_view(self, tier: TierKind, pool_group: int, pool: int = 0, rank: int = 0) -> object:
        """
        A pool of one tier as a numpy array [slots, slot bytes] over rank `rank`'s memory.
        """

    @property
    def state_group(self) -> int | None: ...

    @property
    def num_requests(self) -> int:
        """Requests alive."""

    def take_copies(self) -> list:
        """
        BackendKind.ENGINE: the copy batches the steps handed out and those queued since, oldest first (KvCacheManager.take_copies); run them before the step's kernels, then copies_done(event).
        """

    @property
    def replay_resets(self) -> list[int]:
        """Replay indices the engine resets before running the last decode_step."""

    def need_adjustment(self) -> bool:
        """Whether a rebalancing step would move slots between pool groups now."""

    def adjust(self) -> bool:
        """
        Takes one rebalancing step (ServingConfig.policies.rebalance); returns whether slots moved.
        """

    def evict_ahead(self, step_tokens: int) -> int:
        """
        Frees GPU slots for step_tokens new tokens in every attention group (at most 1/8 of a pool group) while the GPU computes a step, so the next step's allocations find them free; returns the pages evicted (moved down a tier or dropped, as an allocation would).
        """

    def touch_reuse(self, prompt: Sequence[int]) -> int:
        """
        A request waits in the engine's queue: the tree pages its prompt would reuse become the most recently used in their eviction queues (no reference taken, nothing counted), so the requests admitted before it do not evict them first. Returns the tokens it would reuse.
        """

    def reset_replay(self, stream: int = 0, rank: int = 0) -> None:
        """
        Zeroes rank `rank`'s replay buffers of the last decode_step's replay_resets (one batched kernel on the CUDA stream with the cuda backend); once per rank.
        """

    def scan_non_finite(self, request_id: int | None = None) -> list:
        """
        NaN/Inf by declared dtype in one request's pages, or every living cache's: dicts of layer, role, slot, element and request_id.
        """

    def fetch_shared(self, tokens: Sequence[int]) -> dict:
        """
        Brings the prompt's blocks the local tree lacks from the shared tier (config shared), as far as the hybrid rule allows; call it before creating the request. A dict (SharedFetch: local_tokens, hit_tokens, objects_fetched, ...).
        """

    def fetch_shared_async(self, tokens: Sequence[int]) -> SharedFetchFuture:
        """
        fetch_shared on the shared tier's own thread, as a prefetch: returns a SharedFetchFuture at once (done(), result()); create the request once it is done.
        """

    def shared_stats(self) -> dict:
        """The shared tier's counters (SharedTierStats) as a dict."""

    def copies_done(self, event: int) -> None:
        """
        BackendKind.ENGINE: the engine ran every copy batch up to `event` (take_copies' 'event').
        """

    def flush_shared(self) -> None:
        """
        Returns once every committed object queued for the shared tier has been written.
        """

    def take_events(self) -> list:
        """
        The tree's changes since the last call (ManagerConfig.record_events): dicts with kind ('stored', 'removed', 'updated'), key and parent_key (hex), tokens, group, tier and priority.
        """

    def take_iteration_stats(self) -> dict:
        """
        Counters since the previous call (then zero): pages, tier moves, suspends, resumes.
        """

    def reuse_stats(self) -> dict:
        """
        Prefix-reuse counters per cache group (hybridkv/reuse.h's GroupReuseStats), pages served by tier, and the tree size.
        """

    def take_reuse_stats(self) -> dict:
        """
        reuse_stats(), then the counters restart from zero (per-interval figures).
        """

    def storage_stats(self) -> list:
        """
        Slots per tier and pool group: dicts of tier, pool_group, total_slots, free_slots and evictable_slots.
        """

    def quota(self, tier: TierKind) -> int:
        """The tier's quota in bytes."""

    def set_quota(self, tier: TierKind, quota_bytes: int) -> None:
        """
        Grows or shrinks a tier while caches live. Refused, changing nothing: ValueError below the GPU floors, RefusedError beyond the tier's max_quota_bytes, OutOfPagesError when the pages in use do not fit.
        """

    def copy_error(self) -> str | None:
        """
        None, or the first copy that failed (a DISK tier write or read) and which slot.
        """

    def wait(self, event: int) -> None:
        """Blocks until every copy up to the event (a ticket) completed."""

    def stream_wait(self, stream: int, event: int) -> None:
        """
        Makes a CUDA stream (its handle, e.g. torch.cuda.current_stream().cuda_stream) wait for the copies up to the event without blocking the host (CUDA backend; others block).
        """

    def synchronize(self) -> None:
        """
        Blocks until every copy submitted so far has completed (pool views read after it see them).
        """

class HybridKvError(RuntimeError):
    pass

class KvCache:
    """One request's cache (kv_cache.h); closes when collected."""

    @property
    def state(self) -> CacheState: ...

    @property
    def capacity(self) -> int: ...

    @property
    def history(self) -> int: ...

    @property
    def committed_tokens(self) -> int: ...

    @property
    def reused_tokens(self) -> int: ...

    def resume(self, stream: int = 0) -> None:
        """
        SUSPENDED -> ACTIVE (RefusedError at the gate, OutOfPagesError without room). With a CUDA stream handle the stream waits for the onboarding copies (cuda backend).
        """

    @property
    def ready_event(self) -> int:
        """
        The copy event (a ticket) the engine waits on before touching the pages.
        """

    def prefetch(self, max_pages: int | None = None) -> int:
        """
        Starts onboarding a SUSPENDED cache's pages so that resume only waits. With max_pages: at most that many, answering how many (fewer: none is left away), to spread a long prefix over steps; without: all of them (answers 0).
        """

    @property
    def pages_away(self) -> int:
        """
        How many of a SUSPENDED cache's pages sit on a colder tier now: resume it in a step once few are left, prefetch the rest between steps.
        """

    def plan_snapshot_drop(self) -> PlannedDrop:
        """A PlannedDrop of the snapshots this cache would leave in the tree."""

    def suspend(self) -> None: ...

    def resize(self, capacity: int, history: int) -> None: ...

    def commit(self, tokens: Sequence[int], is_end: bool = False, role: SnapshotRole = SnapshotRole.KEPT) -> None:
        """
        Publishes tokens [committed, committed + len); role SPECULATIVE: a snapshot at a point no request is known to resume from (published demoted, superseding nothing).
        """

    def reserve_states(self, points: Sequence[int], role: SnapshotRole = SnapshotRole.SPECULATIVE) -> list[int]:
        """
        GPU pages for the states a chunked kernel writes inside the coming chunk, one per SSM group and point (multiples of tokens_per_block in (history, capacity]); returns the points reserved (SPECULATIVE: those that cost no page of value; KEPT: all or OutOfPagesError). A commit ending at a reserved point publishes its state.
        """

    def reserved_state_slots(self, group: int) -> list[int]:
        """
        The GPU slots of the reserved states of an SSM group, in point order (valid until the next reserve_states, commit, suspend or close, or the manager's adjust()).
        """

    def commit_kv(self, tokens: Sequence[int]) -> None:
        """Publishes the KV of full blocks only (no snapshot)."""

    def close(self) -> None: ...

    def block_table(self, group: int, beam: int = 0) -> list[int]:
        """A copy of the block table."""

    def set_index_buffer(self, group: int, beam: int, buffer: object | None) -> None:
        """
        An int32 numpy array the cache keeps equal to its block table (padded with -1) on every change; None detaches it.
        """

    def state_index(self, group: int, beam: int = 0) -> int:
        """The SSM slot of a recurrent group (for kernels)."""

class KvCacheManager:
    """The general manager (manager.h)."""

    def fetch_shared(self, tokens: Sequence[int]) -> dict:
        """
        Brings the prompt's blocks the local tree lacks from the shared tier (config shared), as far as the hybrid rule allows; call it before creating the request. A dict (SharedFetch: local_tokens, hit_tokens, objects_fetched, ...).
        """

    def fetch_shared_async(self, tokens: Sequence[int]) -> SharedFetchFuture:
        """
        fetch_shared on the shared tier's own thread, as a prefetch: returns a SharedFetchFuture at once (done(), result()); create the request once it is done.
        """

    def shared_stats(self) -> dict:
        """The shared tier's counters (SharedTierStats) as a dict."""

    def copies_done(self, event: int) -> None:
        """
        BackendKind.ENGINE: the engine ran every copy batch up to `event` (take_copies' 'event').
        """

    def flush_shared(self) -> None:
        """
        Returns once every committed object queued for the shared tier has been written.
        """

    def take_events(self) -> list:
        """
        The tree's changes since the last call (ManagerConfig.record_events): dicts with kind ('stored', 'removed', 'updated'), key and parent_key (hex), tokens, group, tier and priority.
        """

    def take_iteration_stats(self) -> dict:
        """
        Counters since the previous call (then zero): pages, tier moves, suspends, resumes.
        """

    def reuse_stats(self) -> dict:
        """
        Prefix-reuse counters per cache group (hybridkv/reuse.h's GroupReuseStats), pages served by tier, and the tree size.
        """

    def take_reuse_stats(self) -> dict:
        """
        reuse_stats(), then the counters restart from zero (per-interval figures).
        """

    def storage_stats(self) -> list:
        """
        Slots per tier and pool group: dicts of tier, pool_group, total_slots, free_slots and evictable_slots.
        """

    def quota(self, tier: TierKind) -> int:
        """The tier's quota in bytes."""

    def set_quota(self, tier: TierKind, quota_bytes: int) -> None:
        """
        Grows or shrinks a tier while caches live. Refused, changing nothing: ValueError below the GPU floors, RefusedError beyond the tier's max_quota_bytes, OutOfPagesError when the pages in use do not fit.
        """

    def copy_error(self) -> str | None:
        """
        None, or the first copy that failed (a DISK tier write or read) and which slot.
        """

    def wait(self, event: int) -> None:
        """Blocks until every copy up to the event (a ticket) completed."""

    def stream_wait(self, stream: int, event: int) -> None:
        """
        Makes a CUDA stream (its handle, e.g. torch.cuda.current_stream().cuda_stream) wait for the copies up to the event without blocking the host (CUDA backend; others block).
        """

    def synchronize(self) -> None:
        """
        Blocks until every copy submitted so far has completed (pool views read after it see them).
        """

    @staticmethod
    def create(config: ManagerConfig, backend: BackendKind = BackendKind.HOST, device: int = 0, devices: Sequence[int] = []) -> KvCacheManager:
        """
        devices: one tensor-parallel rank per entry, each on that CUDA device (HOST: ranks in host memory); every copy runs on each rank, one set of tables for all.
        """

    def create_kv_cache(self, input_tokens: Sequence[int] = [], beam_width: int = 1) -> KvCache:
        """
        A new SUSPENDED cache holding what the prefix tree offers for the prompt.
        """

    def probe_reuse(self, tokens: Sequence[int]) -> int:
        """Tokens a cache created for this prompt would reuse (changes nothing)."""

    def touch_reuse(self, tokens: Sequence[int]) -> int:
        """
        A request waits in the engine's queue: the tree pages a cache for this prompt would reuse become the most recently used in their eviction queues (no reference taken, nothing counted). Returns the tokens it would reuse.
        """

    def take_copies(self) -> list:
        """
        BackendKind.ENGINE: the copy batches submitted since the last take, oldest first: dicts (event, lists of {src_tier, dst_tier, src_pool_group, dst_pool_group, slot_bytes, src_slots, dst_slots}); run the lists in order, then copies_done(event).
        """

    def need_adjustment(self) -> bool: ...

    def adjust(self) -> bool: ...

    def evict_ahead(self, free_slots: Sequence[int], max_evictions: int) -> int:
        """
        Evicts until GPU pool group g has free_slots[g] free slots, max_evictions pages went or nothing is left to evict; returns the pages evicted. Call it while the GPU computes a step.
        """

    @property
    def ranks(self) -> int: ...

    @property
    def num_cache_groups(self) -> int: ...

class ManagerConfig:
    """Layers, tiers and knobs (config.h)."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def tokens_per_block(self) -> int: ...

    @tokens_per_block.setter
    def tokens_per_block(self, arg: int, /) -> None: ...

    @property
    def attention_layers(self) -> list[AttentionLayerConfig]: ...

    @attention_layers.setter
    def attention_layers(self, arg: Sequence[AttentionLayerConfig], /) -> None: ...

    @property
    def ssm_layers(self) -> list[SsmLayerConfig]: ...

    @ssm_layers.setter
    def ssm_layers(self, arg: Sequence[SsmLayerConfig], /) -> None: ...

    @property
    def tiers(self) -> list[TierConfig]: ...

    @tiers.setter
    def tiers(self, arg: Sequence[TierConfig], /) -> None: ...

    @property
    def max_util_for_resume(self) -> float: ...

    @max_util_for_resume.setter
    def max_util_for_resume(self, arg: float, /) -> None: ...

    @property
    def max_live_kv_caches(self) -> int | None: ...

    @max_live_kv_caches.setter
    def max_live_kv_caches(self, arg: int, /) -> None: ...

    @property
    def enable_block_reuse(self) -> bool: ...

    @enable_block_reuse.setter
    def enable_block_reuse(self, arg: bool, /) -> None: ...

    @property
    def commit_min_snapshot(self) -> bool: ...

    @commit_min_snapshot.setter
    def commit_min_snapshot(self, arg: bool, /) -> None: ...

    @property
    def enable_partial_reuse(self) -> bool: ...

    @enable_partial_reuse.setter
    def enable_partial_reuse(self, arg: bool, /) -> None: ...

    @property
    def policies(self) -> PolicyConfig: ...

    @policies.setter
    def policies(self, arg: PolicyConfig, /) -> None: ...

    @property
    def snapshot_dtype(self) -> DType | None: ...

    @snapshot_dtype.setter
    def snapshot_dtype(self, arg: DType, /) -> None: ...

    @property
    def pool_ratio(self) -> list[float] | None: ...

    @pool_ratio.setter
    def pool_ratio(self, arg: Sequence[float], /) -> None: ...

    @property
    def record_events(self) -> bool: ...

    @record_events.setter
    def record_events(self, arg: bool, /) -> None: ...

    @property
    def reuse_match_backoff(self) -> int: ...

    @reuse_match_backoff.setter
    def reuse_match_backoff(self, arg: int, /) -> None: ...

    @property
    def block_hash(self) -> BlockHash: ...

    @block_hash.setter
    def block_hash(self, arg: BlockHash, /) -> None: ...

    @property
    def swa_scratch_reuse(self) -> bool: ...

    @swa_scratch_reuse.setter
    def swa_scratch_reuse(self, arg: bool, /) -> None: ...

    @property
    def max_rewind_len(self) -> int: ...

    @max_rewind_len.setter
    def max_rewind_len(self, arg: int, /) -> None: ...

    @property
    def typical_step(self) -> BatchShape | None: ...

    @typical_step.setter
    def typical_step(self, arg: BatchShape, /) -> None: ...

    @property
    def constraints(self) -> list[BatchShape]: ...

    @constraints.setter
    def constraints(self, arg: Sequence[BatchShape], /) -> None: ...

    @property
    def shared(self) -> SharedTierConfig: ...

    @shared.setter
    def shared(self, arg: SharedTierConfig, /) -> None: ...

class ModelDescription:
    """A model's cache layers (read_model_config)."""

    @property
    def source(self) -> str: ...

    @property
    def model_type(self) -> str: ...

    @property
    def family(self) -> str: ...

    @property
    def num_model_layers(self) -> int: ...

    @property
    def tp_size(self) -> int: ...

    @property
    def kv_bytes_per_token(self) -> int: ...

    @property
    def state_bytes_per_sequence(self) -> int: ...

    @property
    def num_attention_layers(self) -> int: ...

    @property
    def num_recurrent_layers(self) -> int: ...

    @property
    def layers(self) -> list:
        """
        The cache layers: dicts of cache_layer, model_layer, mixer ('attention', 'mamba2', ...), window, kv_heads, head_dim, conv_elements, ssm_elements and the recurrent shape (num_heads, state_size, n_groups, d_inner, conv_dim, conv_kernel).
        """

class OutOfPagesError(HybridKvError):
    pass

class PlannedDrop:
    """A planned snapshot drop (kv_cache.h)."""

    @property
    def id(self) -> int: ...

    def release(self) -> None:
        """Runs the plan (KeyError when it was released before)."""

class PolicyConfig:
    """
    The manager's policies, each by name (config.h): eviction ('priced', 'snapshot-aware', 'lru'), offload ('selective', 'all', 'room'), keep_colder_copies, rebalance ('off', 'pressure'), upkeep_between_steps (the tree's upkeep after a snapshot drop waits for evict_ahead).
    """

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def eviction(self) -> str: ...

    @eviction.setter
    def eviction(self, arg: str, /) -> None: ...

    @property
    def offload(self) -> str: ...

    @offload.setter
    def offload(self, arg: str, /) -> None: ...

    @property
    def keep_colder_copies(self) -> bool: ...

    @keep_colder_copies.setter
    def keep_colder_copies(self, arg: bool, /) -> None: ...

    @property
    def rebalance(self) -> str: ...

    @rebalance.setter
    def rebalance(self, arg: str, /) -> None: ...

    @property
    def upkeep_between_steps(self) -> bool: ...

    @upkeep_between_steps.setter
    def upkeep_between_steps(self, arg: bool, /) -> None: ...

class RefusedError(HybridKvError):
    pass

class ReplayLayout(enum.Enum):
    PRIVATE = 0

    RING = 1

class RequestShape:
    """One request of a batch shape: capacity and history tokens."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def capacity(self) -> int: ...

    @capacity.setter
    def capacity(self, arg: int, /) -> None: ...

    @property
    def history(self) -> int: ...

    @history.setter
    def history(self, arg: int, /) -> None: ...

class ReusePolicy(enum.Enum):
    REQUIRED = 0

    OPTIONAL = 1

    PRIVATE = 2

class ServingConfig:
    """Serving settings of one rank (hybridkv/hybrid.h)."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def max_batch(self) -> int: ...

    @max_batch.setter
    def max_batch(self, arg: int, /) -> None: ...

    @property
    def pp_size(self) -> int: ...

    @pp_size.setter
    def pp_size(self, arg: int, /) -> None: ...

    @property
    def pp_rank(self) -> int: ...

    @pp_rank.setter
    def pp_rank(self, arg: int, /) -> None: ...

    @property
    def overlap_scheduling(self) -> bool: ...

    @overlap_scheduling.setter
    def overlap_scheduling(self, arg: bool, /) -> None: ...

    @property
    def role(self) -> DisaggRole: ...

    @role.setter
    def role(self, arg: DisaggRole, /) -> None: ...

    @property
    def mtp_layers(self) -> int | None: ...

    @mtp_layers.setter
    def mtp_layers(self, arg: int, /) -> None: ...

    @property
    def dummy_slots(self) -> int: ...

    @dummy_slots.setter
    def dummy_slots(self, arg: int, /) -> None: ...

    @property
    def num_spec_tokens(self) -> int: ...

    @num_spec_tokens.setter
    def num_spec_tokens(self, arg: int, /) -> None: ...

    @property
    def replay_layout(self) -> ReplayLayout: ...

    @replay_layout.setter
    def replay_layout(self, arg: ReplayLayout, /) -> None: ...

    @property
    def tokens_per_block(self) -> int: ...

    @tokens_per_block.setter
    def tokens_per_block(self, arg: int, /) -> None: ...

    @property
    def tiers(self) -> list[TierConfig]: ...

    @tiers.setter
    def tiers(self, arg: Sequence[TierConfig], /) -> None: ...

    @property
    def max_util_for_resume(self) -> float: ...

    @max_util_for_resume.setter
    def max_util_for_resume(self, arg: float, /) -> None: ...

    @property
    def enable_block_reuse(self) -> bool: ...

    @enable_block_reuse.setter
    def enable_block_reuse(self, arg: bool, /) -> None: ...

    @property
    def enable_partial_reuse(self) -> bool: ...

    @enable_partial_reuse.setter
    def enable_partial_reuse(self, arg: bool, /) -> None: ...

    @property
    def typical_len(self) -> int: ...

    @typical_len.setter
    def typical_len(self, arg: int, /) -> None: ...

    @property
    def max_seq_len(self) -> int | None: ...

    @max_seq_len.setter
    def max_seq_len(self, arg: int, /) -> None: ...

    @property
    def policies(self) -> PolicyConfig: ...

    @policies.setter
    def policies(self, arg: PolicyConfig, /) -> None: ...

    @property
    def shared(self) -> SharedTierConfig: ...

    @shared.setter
    def shared(self, arg: SharedTierConfig, /) -> None: ...

    @property
    def snapshot_dtype(self) -> DType | None: ...

    @snapshot_dtype.setter
    def snapshot_dtype(self, arg: DType, /) -> None: ...

    @property
    def record_events(self) -> bool: ...

    @record_events.setter
    def record_events(self, arg: bool, /) -> None: ...

    @property
    def snapshots(self) -> SnapshotPolicy: ...

    @snapshots.setter
    def snapshots(self, arg: SnapshotPolicy, /) -> None: ...

class SharedFetchFuture:
    """A fetch_shared_async under way: done() polls, result() waits."""

    def done(self) -> bool:
        """Whether the fetch has finished (result() then returns at once)."""

    def result(self) -> dict:
        """
        Waits for the fetch (the GIL released) and returns fetch_shared's dict, or raises its error (each call the same).
        """

class SharedStore:
    """A store shared by serving instances (shared_store.h)."""

    def ping(self) -> None:
        """Raises when the store does not answer (the message names the address)."""

class SharedTierConfig:
    """The shared tier (config.h)."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def store(self) -> SharedStore: ...

    @store.setter
    def store(self, arg: SharedStore, /) -> None: ...

    @property
    def model_id(self) -> str: ...

    @model_id.setter
    def model_id(self, arg: str, /) -> None: ...

    @property
    def rank(self) -> int: ...

    @rank.setter
    def rank(self, arg: int, /) -> None: ...

    @property
    def max_queued_objects(self) -> int: ...

    @max_queued_objects.setter
    def max_queued_objects(self, arg: int, /) -> None: ...

    @property
    def max_queued_bytes(self) -> int: ...

    @max_queued_bytes.setter
    def max_queued_bytes(self, arg: int, /) -> None: ...

    @property
    def max_lookup_blocks(self) -> int: ...

    @max_lookup_blocks.setter
    def max_lookup_blocks(self, arg: int, /) -> None: ...

    @property
    def prefill_tokens_per_s(self) -> float: ...

    @prefill_tokens_per_s.setter
    def prefill_tokens_per_s(self, arg: float, /) -> None: ...

    @property
    def fetch_bytes_per_s(self) -> float: ...

    @fetch_bytes_per_s.setter
    def fetch_bytes_per_s(self, arg: float, /) -> None: ...

class SnapshotPolicy:
    """Where SSM snapshots are taken."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def periodic_interval(self) -> int | None: ...

    @periodic_interval.setter
    def periodic_interval(self, arg: int, /) -> None: ...

    @property
    def aligned_end(self) -> int | None: ...

    @aligned_end.setter
    def aligned_end(self, arg: int, /) -> None: ...

    @property
    def offsets_from_start(self) -> list[int]: ...

    @offsets_from_start.setter
    def offsets_from_start(self, arg: Sequence[int], /) -> None: ...

    @property
    def offsets_from_end(self) -> list[int]: ...

    @offsets_from_end.setter
    def offsets_from_end(self, arg: Sequence[int], /) -> None: ...

    @property
    def final_prompt_boundary(self) -> bool: ...

    @final_prompt_boundary.setter
    def final_prompt_boundary(self, arg: bool, /) -> None: ...

    @property
    def branch_point(self) -> bool: ...

    @branch_point.setter
    def branch_point(self, arg: bool, /) -> None: ...

    @property
    def demand_driven(self) -> bool: ...

    @demand_driven.setter
    def demand_driven(self, arg: bool, /) -> None: ...

    @property
    def answer_end(self) -> bool: ...

    @answer_end.setter
    def answer_end(self, arg: bool, /) -> None: ...

    @property
    def chunk_states(self) -> bool: ...

    @chunk_states.setter
    def chunk_states(self, arg: bool, /) -> None: ...

class SnapshotRole(enum.Enum):
    KEPT = 0

    SPECULATIVE = 1

class SsmLayerConfig:
    """A recurrent layer's state buffers."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def id(self) -> int: ...

    @id.setter
    def id(self, arg: int, /) -> None: ...

    @property
    def reuse_policy(self) -> ReusePolicy: ...

    @reuse_policy.setter
    def reuse_policy(self, arg: ReusePolicy, /) -> None: ...

    @property
    def buffers(self) -> list[BufferConfig]: ...

    @buffers.setter
    def buffers(self, arg: Sequence[BufferConfig], /) -> None: ...

class TierConfig:
    """One memory tier: kind, quota, directory (disk)."""

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, **kwargs) -> None: ...

    @property
    def kind(self) -> TierKind: ...

    @kind.setter
    def kind(self, arg: TierKind, /) -> None: ...

    @property
    def quota_bytes(self) -> int: ...

    @quota_bytes.setter
    def quota_bytes(self, arg: int, /) -> None: ...

    @property
    def path(self) -> str: ...

    @path.setter
    def path(self, arg: str, /) -> None: ...

    @property
    def max_quota_bytes(self) -> int: ...

    @max_quota_bytes.setter
    def max_quota_bytes(self, arg: int, /) -> None: ...

class TierKind(enum.Enum):
    GPU = 0

    HOST = 1

    DISK = 2

def open_redis_store(host: str = '127.0.0.1', port: int = 6379, cluster: bool = False, timeout_ms: int = 250) -> SharedStore:
    """
    A Redis server (or, with cluster, a Redis Cluster node) as the shared tier's store; it need not be up yet (calls miss until it is).
    """

def plan_json(model: ModelDescription, serving: ServingConfig) -> str:
    """The storage plan as `hybridkv plan --json` prints it (a string)."""

def plan_text(model: ModelDescription, serving: ServingConfig) -> str:
    """The storage plan as `hybridkv plan` prints it."""

def read_model_config(source: object, tp: int = 1, kv_dtype: str | None = None, ssm_dtype: str | None = None, conv_dtype: str | None = None) -> ModelDescription:
    """
    A HuggingFace config.json (a path, or the parsed dict) as a ModelDescription; dtypes by name ('f32', 'bf16', ...).
    """

def run_cli(argv: Sequence[str]) -> int:
    """Runs `hybridkv argv[1:]...` in this process; returns the exit code."""
