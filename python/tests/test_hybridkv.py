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
    assert not p.upkeep_between_steps
    assert hk.PolicyConfig(upkeep_between_steps=True).upkeep_between_steps
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
