"""Tests of the manager-level Python API (KvCacheManager and KvCache objects, events, stats,
planned drops, NaN scans, engine-owned memory, step copies)."""

import gc

import numpy as np
import pytest

import hybridkv as hk
from test_hybridkv import model, prefill, serving


def small_manager_config(tiers=None, **kw):
    """One recurrent layer and one attention layer, 16-token blocks, 8 MiB of GPU (or `tiers`)."""
    return hk.ManagerConfig(
        tokens_per_block=16,
        ssm_layers=[hk.SsmLayerConfig(id=0, buffers=[
            hk.BufferConfig(role="ssm_state", bytes_per_page=4096, dtype=hk.DType.F32)])],
        attention_layers=[hk.AttentionLayerConfig(id=1, buffers=[
            hk.BufferConfig(role="key", bytes_per_page=2048),
            hk.BufferConfig(role="value", bytes_per_page=2048)])],
        tiers=tiers or [hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=8 << 20)],
        commit_min_snapshot=True, **kw)


def test_kv_cache_lifecycle_reuse_and_a_cache_outliving_its_manager():
    m = hk.KvCacheManager.create(small_manager_config())
    assert m.num_cache_groups == 2
    prompt = list(range(100, 180))
    a = m.create_kv_cache(prompt)
    assert a.state == hk.CacheState.SUSPENDED and a.reused_tokens == 0
    a.resume()
    a.resize(64, 0)
    a.resize(64, 64)
    a.commit(prompt[:64])
    assert a.committed_tokens == 64 and len(a.block_table(1)) == 4 and a.state_index(0) >= 0
    with pytest.raises(ValueError):
        a.commit(prompt[:10])  # must start at what is committed and end at history
    # An engine-owned index buffer: the cache writes its table there (no copy per step).
    table = np.full(8, 99, dtype=np.int32)
    a.set_index_buffer(1, 0, table)
    assert list(table[:4]) == a.block_table(1) and list(table[4:]) == [-1] * 4
    a.resize(80, 64)
    assert list(table[:5]) == a.block_table(1)
    with pytest.raises(ValueError, match="index buffer of group 1 beam 0 holds 8 entries"):
        a.resize(16 * 9, 64)  # the buffer holds 8 blocks: refused, nothing changed
    assert a.capacity == 80
    a.set_index_buffer(1, 0, None)
    a.resize(64, 64)
    a.close()
    assert m.probe_reuse(prompt) == 64
    assert m.touch_reuse(prompt) == 64  # what it would reuse; nothing is taken
    assert m.probe_reuse(prompt) == 64
    b = m.create_kv_cache(prompt)
    assert b.reused_tokens == 64
    del m
    gc.collect()
    b.resume()  # the cache keeps the manager's state alive
    assert b.history == 64
    b.close()
    with pytest.raises(ValueError, match="tokens_per_block 0"):
        hk.KvCacheManager.create(hk.ManagerConfig(tokens_per_block=0))


def test_events_stats_quotas_and_copy_events_from_python():
    s = serving(host=1 << 30, record_events=True)
    h = hk.HybridCacheManager(model(), s, hk.BackendKind.HOST)
    h.add_request(1, list(range(64)))
    h.resume(1)
    prefill(h, 1, 64)
    events = h.take_events()
    assert events and events[0]["kind"] == "stored" and len(events[0]["key"]) == 64
    assert h.take_events() == []  # taken
    stats = h.storage_stats()
    gpu = [d for d in stats if d["tier"] == hk.TierKind.GPU]
    assert gpu and all(d["free_slots"] <= d["total_slots"] for d in gpu)
    q = h.quota(hk.TierKind.HOST)
    h.set_quota(hk.TierKind.HOST, q // 2)
    assert h.quota(hk.TierKind.HOST) == q // 2
    with pytest.raises(KeyError, match="no DISK tier is configured"):
        h.quota(hk.TierKind.DISK)
    assert h.copy_error() is None
    h.synchronize()
    h.wait(1 << 40)  # a future ticket: everything so far


def test_kv_cache_prefetch_ready_event_and_planned_drops():
    c = hk.ManagerConfig(
        tokens_per_block=16,
        attention_layers=[hk.AttentionLayerConfig(id=0, buffers=[hk.BufferConfig(role="key", bytes_per_page=4096)])],
        ssm_layers=[hk.SsmLayerConfig(id=1, buffers=[hk.BufferConfig(role="ssm_state", bytes_per_page=8192)])],
        tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=8 << 20),
               hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=8 << 20)])
    m = hk.KvCacheManager.create(c)
    tokens = list(range(100))
    a = m.create_kv_cache(tokens)
    a.resume()
    a.resize(64, 0)
    a.resize(64, 64)
    a.commit(tokens[:64])
    drop = a.plan_snapshot_drop()
    drop.release()
    with pytest.raises(KeyError, match="already dropped"):
        drop.release()
    a.suspend()
    with pytest.raises(ValueError, match="max_pages is 0"):
        a.prefetch(max_pages=0)
    assert a.prefetch(max_pages=8) == 0  # every page is on the GPU: nothing to onboard
    assert a.pages_away == 0
    a.prefetch()
    a.resume()
    with pytest.raises(RuntimeError, match="pages_away"):
        a.pages_away  # ACTIVE: not a question for a running cache
    m.wait(a.ready_event)
    assert a.capacity == 64
    st = m.take_iteration_stats()
    assert st["resumes"] == 2
    assert len(st["tiers"]) == 2  # moves by tier: into it (offloads), out of it (onboards)
    assert sum(t["offloaded_bytes"] for t in st["tiers"]) == st["bytes_offloaded"]
    assert sum(t["onboarded_bytes"] for t in st["tiers"]) == st["bytes_onboarded"]
    assert sum(t["returned_to_copy_bytes"] for t in st["tiers"]) == st["bytes_returned_to_copy"]
    assert st["bytes_copies_kept"] >= st["bytes_returned_to_copy"]
    assert m.copy_error() is None


def test_nan_scan_and_replay_reset_run_over_the_managers_memory():
    h = hk.HybridCacheManager(model(), serving(num_spec_tokens=3), hk.BackendKind.HOST)
    h.add_request(1, list(range(40)))
    h.resume(1)
    prefill(h, 1, 40)
    state, replay, _ = h.decode_step(np.array([1], dtype=np.uint64))
    assert h.replay_resets == [int(replay[0])]
    layer = 0
    x = h.buffer_view(hk.TierKind.GPU, layer, "replay_old_x")
    x[int(replay[0])] = 7
    h.reset_replay()
    assert not x[int(replay[0])].any()  # zeroed through the manager, seen through the view
    ssm = h.buffer_view(hk.TierKind.GPU, layer, "ssm_state")
    ssm[int(state[0])] = 0
    ssm[int(state[0]), 5] = np.nan
    found = [r for r in h.scan_non_finite(1) if r["role"] == "ssm_state" and r["layer"] == layer]
    assert found and found[0]["element"] == 5 and found[0]["request_id"] == 1



def test_engine_owned_memory_hands_out_the_copies():
    """BackendKind.ENGINE: the manager decides, the engine runs the copy lists and reports."""
    m = hk.KvCacheManager.create(
        small_manager_config(tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=1 << 20),
                                    hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=8 << 20)]),
        backend=hk.BackendKind.ENGINE)
    caches = []
    for i in range(20):  # more than the GPU holds: the suspended ones go down to the host
        c = m.create_kv_cache([i] * 600)
        c.resume()
        c.resize(600, 600)
        c.suspend()
        caches.append(c)
    caches[0].resume()  # back from the host
    batches = m.take_copies()
    assert batches and all(b["event"] > 0 for b in batches)
    pairs = {(l["src_tier"], l["dst_tier"]) for b in batches for l in b["lists"]}
    assert (hk.TierKind.GPU, hk.TierKind.HOST) in pairs
    assert (hk.TierKind.HOST, hk.TierKind.GPU) in pairs
    for b in batches:
        for l in b["lists"]:
            assert len(l["src_slots"]) == len(l["dst_slots"]) > 0 and l["slot_bytes"] > 0
    m.copies_done(batches[-1]["event"])
    assert m.take_copies() == []
    with pytest.raises(ValueError, match="never submitted"):
        m.copies_done(10 ** 9)
    host = hk.KvCacheManager.create(small_manager_config())
    with pytest.raises(hk.HybridKvError, match="only .engine. hands them out"):
        host.take_copies()


def test_a_hybrid_managers_steps_keep_their_copies_until_taken():
    """The snapshot copy a commit queues comes out of take_copies after the step that took it."""
    h = hk.HybridCacheManager(model(), serving(), hk.BackendKind.ENGINE)
    h.add_request(1, list(range(200)))
    h.resume(1)
    h.take_copies()
    prefill(h, 1, h.next_snapshot_point(1))
    h.decode_step([1])  # the step takes the queued copies; the manager keeps them for Python
    batches = h.take_copies()
    assert batches and any(l["src_tier"] == hk.TierKind.GPU and l["dst_tier"] == hk.TierKind.GPU
                           for b in batches for l in b["lists"])
    h.copies_done(batches[-1]["event"])
    assert h.take_copies() == []
    with pytest.raises(hk.HybridKvError, match="only 'engine' hands them out"):
        hk.HybridCacheManager(model(), serving(), hk.BackendKind.NONE).take_copies()
