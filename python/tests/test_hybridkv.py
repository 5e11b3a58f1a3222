"""Tests of the Python module: API round trips, errors, reuse, zero-copy views, lifetimes,
threads, the command line and a randomized scheduler (its seed is printed)."""

import gc
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import hybridkv as hk

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = str(ROOT / "models" / "nemotron_h_8b.json")
SLICE = str(ROOT / "data" / "mooncake_conversation_first1000.jsonl")


def serving(gpu=4 << 30, host=0, **kw):
    tiers = [hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=gpu)]
    if host:
        tiers.append(hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=host))
    kw.setdefault("max_batch", 4)
    return hk.ServingConfig(tokens_per_block=16, tiers=tiers, **kw)


def model():
    return hk.read_model_config(NEMOTRON, tp=8)


def prefill(h, rid, upto):
    r = h.request(rid)
    h.resize(rid, upto, r["history"])
    h.resize(rid, upto, upto)
    h.commit_at_snapshot(rid)


def test_configs_keep_the_cpp_defaults_and_refuse_unknown_fields():
    s = hk.ServingConfig()
    assert (s.max_batch, s.tokens_per_block, s.typical_len) == (64, 32, 2048)
    assert s.snapshots.final_prompt_boundary and not s.snapshots.branch_point
    assert s.tiers[0].kind == hk.TierKind.GPU and s.tiers[0].quota_bytes == 16 << 30
    s = hk.ServingConfig(max_batch=3, snapshots=hk.SnapshotPolicy(aligned_end=512))
    assert s.max_batch == 3 and s.snapshots.aligned_end == 512
    with pytest.raises(TypeError, match="no field 'max_bat'"):
        hk.ServingConfig(max_bat=3)
    assert hk.ServingConfig().snapshot_dtype is None
    m = hk.ManagerConfig()  # the eviction and offload knobs, as in config.h
    p = m.policies
    assert (p.eviction, p.offload, p.keep_colder_copies, p.rebalance) == (
        "priced", "selective", True, "off")
    off = hk.ManagerConfig(policies=hk.PolicyConfig(keep_colder_copies=False))
    assert not off.policies.keep_colder_copies
    assert hk.ServingConfig().policies.keep_colder_copies
    bf16 = hk.ServingConfig(snapshot_dtype=hk.DType.BF16)
    assert "bf16 snapshots" in hk.plan_text(hk.read_model_config(NEMOTRON), bf16)
    fp8 = hk.ServingConfig(snapshot_dtype=hk.DType.FP8_E4M3)
    assert "fp8_e4m3 snapshots" in hk.plan_text(hk.read_model_config(NEMOTRON), fp8)
    with pytest.raises(ValueError, match="snapshot_dtype fp8_e5m2 is not supported"):
        hk.plan_text(hk.read_model_config(NEMOTRON), hk.ServingConfig(snapshot_dtype=hk.DType.FP8_E5M2))


def test_model_from_a_dict_equals_the_file():
    import json

    with open(NEMOTRON) as f:
        as_dict = hk.read_model_config(json.load(f))
    as_file = hk.read_model_config(NEMOTRON)
    assert as_dict.kv_bytes_per_token == as_file.kv_bytes_per_token == 16384
    assert as_dict.state_bytes_per_sequence == as_file.state_bytes_per_sequence
    with pytest.raises(KeyError):
        hk.read_model_config(str(ROOT / "no_such_config.json"))


def test_model_layers_dtypes_and_non_finite_fields():
    import json

    with open(NEMOTRON) as f:
        config = json.load(f)
    config["time_step_limit"] = [0.0, float("inf")]  # transformers writes Infinity here
    m = hk.read_model_config(config, conv_dtype="float32")
    mamba = [d for d in m.layers if d["mixer"] == "mamba2"]
    attention = [d for d in m.layers if d["mixer"] == "attention"]
    assert (len(mamba), len(attention)) == (24, 4)
    assert attention[0]["model_layer"] == 7 and attention[0]["kv_heads"] == 8
    assert mamba[0]["conv_kernel"] == 4 and mamba[0]["conv_elements"] == mamba[0]["conv_dim"] * 3
    # conv fp32: twice the bf16 conv bytes of the file's defaults
    bf16 = hk.read_model_config(NEMOTRON)
    conv = sum(d["conv_elements"] for d in mamba)
    assert m.state_bytes_per_sequence - bf16.state_bytes_per_sequence == 2 * conv
    with pytest.raises(ValueError, match="conv_dtype: 'f33' is not a dtype"):
        hk.read_model_config(NEMOTRON, conv_dtype="f33")


def test_plan_reports_match_the_command_line():
    m = hk.read_model_config(NEMOTRON)
    text = hk.plan_text(m, hk.ServingConfig())
    cli = subprocess.run([sys.executable, "-m", "hybridkv", "plan", "--model", NEMOTRON],
                         capture_output=True, text=True, check=True)
    assert cli.stdout == text
    plan = hk.plan(m, hk.ServingConfig())
    assert plan["model"]["model_type"] == "nemotron_h"
    assert len(plan["pool_groups"]) == 2


def test_errors_are_python_exceptions_with_the_library_messages():
    m = model()
    with pytest.raises(ValueError, match="max_batch 0 must be > 0"):
        hk.plan_text(m, hk.ServingConfig(max_batch=0))
    h = hk.HybridCacheManager(m, serving(), hk.BackendKind.NONE)
    with pytest.raises(KeyError, match="request 7 is unknown"):
        h.resume(7)
    h.add_request(1, list(range(64)))
    h.resume(1)
    with pytest.raises(hk.OutOfPagesError) as e:
        h.resize(1, 1 << 30, 0)
    assert isinstance(e.value, hk.HybridKvError)
    assert h.request(1)["capacity"] == 0  # refused: nothing changed


def test_two_requests_share_a_prefix():
    h = hk.HybridCacheManager(model(), serving(snapshots=hk.SnapshotPolicy(periodic_interval=64)),
                              hk.BackendKind.HOST)
    shared = list(range(1000, 1200))
    h.add_request(1, shared + [1, 2, 3])
    h.resume(1)
    for point in (64, 128, 192, 203):
        prefill(h, 1, point)
    h.free_request(1)
    h.add_request(2, shared + [7, 8, 9, 10])
    assert h.request(2)["reused_tokens"] == 192
    assert h.reuse_stats()["tree_blocks"] > 0


def test_step_arrays_are_the_steps_own_and_pool_views_alias_its_memory():
    h = hk.HybridCacheManager(model(), serving(), hk.BackendKind.HOST)
    ids = np.array([1, 2], dtype=np.uint64)
    for rid in ids:
        h.add_request(int(rid), list(range(40)))
        h.resume(int(rid))
        prefill(h, int(rid), 40)
    state, replay, tables = h.decode_step(ids, group=1)
    assert tables.shape == (2, 3) and list(tables[0]) == h.block_table(1, 1)
    assert state[0] != state[1]  # each request its own state slot
    assert h.replay_resets == []  # no speculative decoding: no replay state
    assert h.take_iteration_stats()["pages_allocated"] > 0
    first = tables.copy()
    # A later step leaves this step's arrays as they were (they own their memory).
    h.free_request(1)
    _, _, again = h.decode_step([2], group=1)
    assert (tables == first).all() and list(again[0]) == h.block_table(2, 1)
    # Pool memory: write through one view, read through another.
    a = h.pool_view(hk.TierKind.GPU, 1)
    b = h.pool_view(hk.TierKind.GPU, 1)
    slot = int(again[0][0])
    a[slot, :8] = np.arange(8, dtype=np.uint8)
    assert list(b[slot, :8]) == list(range(8))
    with pytest.raises(ValueError, match="the tier is not configured"):
        h.pool_view(hk.TierKind.HOST, 1)
    # A layer's SSM state as float32 rows: the row of a request's state index is its state, and
    # numpy's DLPack export sees the same memory.
    ssm = h.buffer_view(hk.TierKind.GPU, 0, "ssm_state")
    assert ssm.dtype == np.float32 and ssm.strides[1] == 4 and ssm.strides[0] >= ssm.shape[1] * 4
    ssm[int(state[1]), :4] = [1.5, 2.5, 3.5, 4.5]
    again_view = np.from_dlpack(h.buffer_view(hk.TierKind.GPU, 0, "ssm_state"))
    assert list(again_view[int(state[1]), :4]) == [1.5, 2.5, 3.5, 4.5]
    with pytest.raises(KeyError):
        h.buffer_view(hk.TierKind.GPU, 0, "no_such_role")
    with pytest.raises(ValueError, match="no pool group 9"):
        h.pool_view(hk.TierKind.GPU, 9)


def test_step_arrays_of_a_smaller_step_survive_a_larger_one():
    """Issue 32: a 2-request step, then a 5-request step with wider block tables; the first
    step's arrays still read what they held (they once pointed into vectors the larger step
    reallocated)."""
    h = hk.HybridCacheManager(model(), serving(max_batch=6), hk.BackendKind.HOST)
    for rid in range(1, 6):
        h.add_request(rid, list(range(rid * 1000, rid * 1000 + 20 + 60 * rid)))
        h.resume(rid)
        prefill(h, rid, 20 + 60 * rid)
    state, replay, tables = h.decode_step([1, 2], group=1)
    kept = (state.copy(), replay.copy(), tables.copy())
    big_state, _, big_tables = h.decode_step([1, 2, 3, 4, 5], group=1)
    assert big_tables.shape[0] == 5 and big_tables.shape[1] > tables.shape[1]
    for mine, before in zip((state, replay, tables), kept):
        assert (mine == before).all()
    assert list(big_tables[4][:len(h.block_table(5, 1))]) == h.block_table(5, 1)
    del big_state, big_tables
    gc.collect()
    assert (tables == kept[2]).all()


def test_step_buffers_keep_their_addresses_and_hold_each_step():
    """Issue 32 item 6: fill_step writes a step into buffers sized once (max_batch entries,
    max_seq_len / tokens_per_block blocks); a larger step later moves nothing."""
    h = hk.HybridCacheManager(model(), serving(max_batch=6, max_seq_len=512), hk.BackendKind.HOST)
    state, replay, tables, groups = h.step_buffers()
    assert state.shape == (6,) and tables.shape == (6, len(groups), 32)
    for rid in range(1, 6):
        h.add_request(rid, list(range(rid * 1000, rid * 1000 + 20 + 60 * rid)))
        h.resume(rid)
        prefill(h, rid, 20 + 60 * rid)
    for ids in ([1, 2], [1, 2, 3, 4, 5], [3]):
        h.decode_step(ids)
        h.fill_step(ids)
        again = h.step_buffers()
        assert again[0].ctypes.data == state.ctypes.data
        assert again[2].ctypes.data == tables.ctypes.data
        for r, rid in enumerate(ids):
            assert state[r] == h.state_index(rid)
            t = h.block_table(rid, groups[0])
            assert list(tables[r, 0, :len(t)]) == t and (tables[r, 0, len(t):] == -1).all()
        assert (state[len(ids):] == -1).all() and (tables[len(ids):] == -1).all()
    with pytest.raises(ValueError, match="dummies but only 0 dummy_slots"):
        h.fill_step([3], num_dummies=1)


def test_views_keep_the_manager_alive_and_objects_free_in_any_order():
    h = hk.HybridCacheManager(model(), serving(), hk.BackendKind.HOST)
    h.add_request(1, list(range(20)))
    h.resume(1)
    prefill(h, 1, 20)
    state, _, _ = h.decode_step(np.array([1], dtype=np.uint64))
    view = h.pool_view(hk.TierKind.GPU, 0)
    del h
    gc.collect()
    assert state[0] >= 0 and view.shape[0] > 0  # still valid: the views own the manager
    view[0, 0] = 1
    del state, view
    gc.collect()


def test_threads_share_one_manager():
    h = hk.HybridCacheManager(model(), serving(gpu=8 << 30), hk.BackendKind.NONE)
    errors = []

    def worker(base):
        try:
            for k in range(50):
                rid = base + k
                h.add_request(rid, list(range(base, base + 64)))
                h.resume(rid)
                prefill(h, rid, 64)
                h.free_request(rid)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(1000 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and h.num_requests == 0


def test_python_m_hybridkv_runs_the_simulator():
    out = subprocess.run([sys.executable, "-m", "hybridkv", "sim", "--model", NEMOTRON, "--trace",
                          SLICE, "--limit", "20", "--tp", "8", "--gpu-quota", "2GiB", "--quiet"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "reused tokens" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "hybridkv", "sin"], capture_output=True, text=True)
    assert bad.returncode == 2 and "did you mean 'sim'" in bad.stderr


def test_randomized_scheduler_keeps_the_invariants():
    seed = int(os.environ.get("HKV_SEED", random.randrange(1 << 32)))
    print(f"seed {seed} (replay with HKV_SEED={seed})")
    rng = random.Random(seed)
    h = hk.HybridCacheManager(model(), serving(gpu=224 << 20, host=256 << 20, max_batch=12,
                                               snapshots=hk.SnapshotPolicy(periodic_interval=1024)),
                              hk.BackendKind.NONE)
    prompts = {}
    stats = {"out_of_pages": 0, "reused": 0, "steps": 0, "refused": 0}
    for op in range(5000):
        rid = rng.randrange(12)
        where = f"seed {seed} op {op}"
        if rid not in prompts:
            base = rng.randrange(3) * 10000  # three families of shared prefixes
            shared = list(range(base, base + rng.randrange(0, 3000)))
            own = [rng.randrange(50000, 90000) for _ in range(rng.randrange(1, 15000))]
            prompts[rid] = shared + own
            h.add_request(rid, prompts[rid])
            r = h.request(rid)
            assert r["reused_tokens"] <= len(prompts[rid]) - 1, where
            stats["reused"] += r["reused_tokens"]
            continue
        r = h.request(rid)
        dice = rng.random()
        try:
            if r["state"] == hk.CacheState.SUSPENDED:
                h.resume(rid)
            elif dice < 0.7:
                upto = min(h.next_snapshot_point(rid), r["history"] + rng.randrange(1, 2000))
                upto = max(upto, r["history"] + 1)
                before = h.request(rid)
                try:
                    h.resize(rid, upto, r["history"])
                except hk.OutOfPagesError:
                    stats["out_of_pages"] += 1
                    assert h.request(rid) == before, where  # a failed call changes nothing
                    h.suspend(rid)
                    continue
                h.resize(rid, upto, upto)
                if upto <= len(prompts[rid]):
                    h.commit_at_snapshot(rid)
                stats["steps"] += 1
            elif dice < 0.92:
                h.suspend(rid)
            else:
                h.free_request(rid)
                del prompts[rid]
        except (hk.RefusedError, hk.OutOfPagesError):
            stats["refused"] += 1  # the resume gate or no room to resume: try again later
    for rid in list(prompts):
        h.free_request(rid)
    assert h.num_requests == 0
    moves = h.take_iteration_stats()  # since the start: nothing took them
    stats.update({k: moves[k] for k in ("bytes_onboarded", "bytes_copies_kept",
                                        "bytes_returned_to_copy")})
    print(stats)
    assert stats["steps"] > 0 and stats["reused"] > 0 and stats["out_of_pages"] > 0
    assert stats["bytes_copies_kept"] >= stats["bytes_returned_to_copy"] > 0  # kept host copies


def test_the_readme_example_runs(capsys, monkeypatch):
    import re

    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "2 reused 96 block table" in out


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
    a.prefetch()
    a.resume()
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
