"""Issue 36: the Python boundary refuses what it cannot take exactly, at once, naming the
request or field, and a call that raised changed nothing."""

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import hybridkv as hk

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = str(ROOT / "models" / "nemotron_h_8b.json")


def manager(**kw):
    serving = hk.ServingConfig(max_batch=8, tokens_per_block=16,
                               tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=4 << 30)], **kw)
    return hk.HybridCacheManager(hk.read_model_config(NEMOTRON, tp=8), serving, hk.BackendKind.NONE)


def started(h, *ids, suspended=()):
    for rid in ids:
        h.add_request(rid, list(range(40)))
        h.resume(rid)
        h.resize(rid, 40, 40)
    for rid in suspended:
        h.suspend(rid)
    return h


def state_of(h, ids):
    return [h.request(r) for r in ids], h.storage_stats()


@pytest.mark.parametrize("capacity", [2**31, 2**34, 2**63, 2**64 - 1])
def test_a_capacity_no_plan_holds_is_refused_at_once(capacity):
    h = started(manager(), 1, 2, suspended=[2])
    before = state_of(h, [1, 2])
    waited = []
    other = threading.Thread(target=lambda: (h.resume(2), waited.append(time.monotonic())))
    start = time.monotonic()
    with pytest.raises((hk.OutOfPagesError, ValueError), match="request 1: resize: capacity"):
        h.resize(1, capacity, 40)
    other.start()
    other.join(timeout=10)
    assert waited, "another thread's call waited behind the refused resize"
    assert time.monotonic() - start < 5  # generous bound; the refusal itself takes microseconds
    h.suspend(2)
    assert state_of(h, [1, 2]) == before


def test_the_longest_capacity_the_gpu_holds_is_refused_only_past_it():
    h = started(manager(), 1)
    with pytest.raises(hk.OutOfPagesError, match="needs .* blocks of cache group 1; its GPU pool "
                       "group 1 holds at most"):
        h.resize(1, 1 << 24, 40)
    h.resize(1, 4096, 40)  # what fits still runs
    assert h.request(1)["capacity"] == 4096


def test_one_row_per_request_and_ids_are_taken_exactly():
    h = started(manager(), 1, 2)
    before = state_of(h, [1, 2])
    with pytest.raises(ValueError, match="decode_step: request 1 appears twice"):
        h.decode_step(np.array([1, 1], np.uint64), group=1)
    for bad in (np.array([1.9, 2.7]), np.array([1, 2], np.int64), np.array([1, 2], np.int32),
                np.array([[1, 2]], np.uint64), "12", 7):
        with pytest.raises(TypeError, match="decode_step: request_ids: expected a 1-D uint64 "
                           "array or a list of ints"):
            h.decode_step(bad, group=1)
    for bad in ([1.9, 2.7], [1, True], [1, None]):
        with pytest.raises(TypeError, match=r"request_ids\[\d\]: expected an int"):
            h.decode_step(bad)
    with pytest.raises(ValueError, match=r"request_ids\[0\]: -1 is not in \[0, 2\^64\)"):
        h.decode_step([-1])
    assert state_of(h, [1, 2]) == before
    state, _, tables = h.decode_step([1, 2], group=1)  # a list of ints is taken as it is
    assert len(state) == 2 and state[0] != state[1] and tables.shape[0] == 2
    state, _, _ = h.decode_step(np.array([2, 1, 2], np.uint64)[::2][:1])  # strided uint64 view
    assert len(state) == 1


@pytest.mark.parametrize("second", ["suspended", "unknown"])
def test_a_step_that_fails_changes_nothing_and_names_the_request(second):
    h = started(manager(), 10, 20, suspended=[20])
    other = 20 if second == "suspended" else 77
    before = state_of(h, [10, 20])
    want = "request 20 is SUSPENDED, not ACTIVE" if second == "suspended" else "request 77 is unknown"
    with pytest.raises((hk.HybridKvError, KeyError), match=want):
        h.decode_step(np.array([10, other], np.uint64))
    assert state_of(h, [10, 20]) == before  # request 10 did not grow
    with pytest.raises(KeyError, match="no cache group|not a cache group"):
        h.decode_step([10], group=99)
    with pytest.raises(ValueError, match="is an SSM group"):
        h.decode_step([10], group=h.state_group)
    assert state_of(h, [10, 20]) == before


def test_a_step_without_room_for_all_changes_nothing():
    serving = hk.ServingConfig(max_batch=8, tokens_per_block=16,
                               tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=160 << 20)])
    h = hk.HybridCacheManager(hk.read_model_config(NEMOTRON, tp=8), serving, hk.BackendKind.NONE)
    ids = list(range(1, 9))
    for rid in ids:
        h.add_request(rid, list(range(rid * 1000, rid * 1000 + 16)))
        h.resume(rid)
    # Grow each to a block boundary, leaving free exactly fewer pages than the step needs.
    free = lambda: sum(s["free_slots"] + s["evictable_slots"] for s in h.storage_stats()
                       if s["pool_group"] == 1)
    for rid in ids:
        h.resize(rid, 16, 16)
    while free() >= len(ids):
        rid = ids[0]
        cap = h.request(rid)["capacity"] + 16
        h.resize(rid, cap, cap)
    before = state_of(h, ids)
    with pytest.raises(hk.OutOfPagesError, match="the 8 caches together; nothing changed"):
        h.decode_step(ids)
    assert state_of(h, ids) == before


def test_index_buffers_are_written_in_place_or_refused():
    config = hk.ManagerConfig(
        tokens_per_block=16,
        attention_layers=[hk.AttentionLayerConfig(id=0, buffers=[
            hk.BufferConfig(role="key", bytes_per_page=1024),
            hk.BufferConfig(role="value", bytes_per_page=1024)])],
        tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=4 << 20)])
    m = hk.KvCacheManager.create(config, hk.BackendKind.NONE)
    c = m.create_kv_cache(list(range(64)))
    c.resume()
    c.resize(64, 0)
    ro = np.zeros(8, np.int32)
    ro.flags.writeable = False
    for bad, what in ((np.zeros(8, np.int64), "dtype int64"),
                      (np.zeros(16, np.int32)[::2], "int32"),
                      (np.zeros((2, 8), np.int32), r"shape \(2, 8\)"),
                      (ro, "read-only"), ([0] * 8, "list")):
        with pytest.raises(TypeError, match="set_index_buffer: buffer: expected a 1-D, "
                           f"contiguous, writable int32 numpy array, got .*{what}"):
            c.set_index_buffer(0, 0, bad)
    table = np.full(8, 99, np.int32)
    c.set_index_buffer(0, 0, table)
    assert list(table[:4]) == c.block_table(0) and list(table[4:]) == [-1] * 4


def test_small_refusals_name_what_is_wrong():
    h = started(manager(), 1)
    with pytest.raises(KeyError, match="request 77 is unknown"):
        h.scan_non_finite(77)


def test_small_refusals_name_what_is_wrong_2():
    # set_quota: the exception its docstring names (pages in use do not fit: OutOfPagesError).
    h = started(manager(), 1)
    h.resize(1, 16 * 4000, 40)
    with pytest.raises(hk.OutOfPagesError, match="LOCKED"):
        h.set_quota(hk.TierKind.GPU, 200 << 20)
    with pytest.raises(ValueError, match="below the GPU floors"):
        h.set_quota(hk.TierKind.GPU, 1 << 20)
    # A model dict with NaN / Infinity where a count belongs names the field and the value.
    with open(NEMOTRON) as f:
        config = __import__("json").load(f)
    for field, value in (("ssm_state_size", float("nan")), ("num_hidden_layers", float("nan")),
                         ("mamba_num_heads", float("inf"))):
        bad = dict(config, **{field: value})
        with pytest.raises(ValueError, match=f"field '{field}': \"(NaN|Infinity)\" must be"):
            hk.read_model_config(bad)
    hk.read_model_config(dict(config, time_step_limit=[0.0, float("inf")]))  # never read
    with pytest.raises(TypeError, match="read_model_config: source: expected a config.json path"):
        hk.read_model_config(5)
    # periodic_interval 0 is refused in Python as the CLI refuses periodic:0.
    model = hk.read_model_config(NEMOTRON, tp=8)
    for policy, field in ((hk.SnapshotPolicy(periodic_interval=0), "periodic_interval"),
                          (hk.SnapshotPolicy(aligned_end=0), "aligned_end")):
        s = hk.ServingConfig(max_batch=4, snapshots=policy)
        with pytest.raises(ValueError, match=f"snapshots.{field} 0 must be > 0"):
            hk.HybridCacheManager(model, s, hk.BackendKind.NONE)
    # A beam width no GPU pool holds is refused, not a MemoryError.
    config = hk.ManagerConfig(
        tokens_per_block=16,
        attention_layers=[hk.AttentionLayerConfig(id=0, buffers=[
            hk.BufferConfig(role="key", bytes_per_page=1024)])],
        tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=4 << 20)])
    m = hk.KvCacheManager.create(config, hk.BackendKind.NONE)
    with pytest.raises(ValueError, match="beam_width 2147483648: each beam needs its own page"):
        m.create_kv_cache([1, 2, 3], beam_width=2**31)


def test_the_none_backend_costs_what_is_used_not_the_quota():
    # 64 TiB of GPU: the bookkeeping of untouched slots costs nothing (it was 3.6 GB at 16 TiB).
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    serving = hk.ServingConfig(max_batch=8, tokens_per_block=32,
                               tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=64 << 40)])
    h = hk.HybridCacheManager(hk.read_model_config(NEMOTRON, tp=8), serving, hk.BackendKind.NONE)
    started(h, 1)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 << 10, f"{grown_kib} KiB for an unused 64 TiB quota"


def test_a_host_allocation_failure_names_the_backend_not_a_cli_flag():
    config = hk.ManagerConfig(
        tokens_per_block=16,
        attention_layers=[hk.AttentionLayerConfig(id=0, buffers=[
            hk.BufferConfig(role="key", bytes_per_page=1 << 20)])],
        tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=1 << 50)])  # a PiB of host memory
    with pytest.raises(hk.OutOfPagesError, match="cannot allocate 1.00 PiB .* use the none "
                       "backend"):
        hk.KvCacheManager.create(config, hk.BackendKind.HOST)


def test_ranks_in_one_manager_or_a_clear_refusal():
    """Issue 34: devices= holds one tensor-parallel rank per entry (HOST: in host memory)."""
    config = hk.ManagerConfig(
        tokens_per_block=16,
        attention_layers=[hk.AttentionLayerConfig(id=0, buffers=[
            hk.BufferConfig(role="key", bytes_per_page=1024)])],
        tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=1 << 20)])
    assert hk.KvCacheManager.create(config, hk.BackendKind.HOST).ranks == 1
    assert hk.KvCacheManager.create(config, hk.BackendKind.HOST, devices=[0, 0]).ranks == 2
    with pytest.raises(ValueError, match="2 devices"):
        hk.KvCacheManager.create(config, hk.BackendKind.NONE, devices=[0, 1])
