"""The Python module on the CUDA backend (marker `gpu`): GPU-tier views are CUDA arrays that
torch takes without a copy, and a request's state survives suspend, eviction to the pinned
host tier and resume. Skipped without torch, a GPU or a CUDA build."""

from pathlib import Path

import numpy as np
import pytest

import hybridkv as hk

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = str(ROOT / "models" / "nemotron_h_8b.json")


def cuda_manager(gpu, host):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tiers = [hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=gpu),
             hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=host)]
    s = hk.ServingConfig(tokens_per_block=16, tiers=tiers, max_batch=2)
    try:
        return hk.HybridCacheManager(hk.read_model_config(NEMOTRON, tp=8), s, hk.BackendKind.CUDA)
    except ValueError as e:
        pytest.skip(f"cuda backend unavailable: {e}")


def test_gpu_views_are_cuda_arrays_and_states_survive_offload():
    h = cuda_manager(gpu=128 << 20, host=2 << 30)
    h.add_request(1, list(range(10, 50)))
    h.resume(1)
    h.resize(1, 40, 0)
    h.resize(1, 40, 40)
    state, _, _ = h.decode_step(np.array([1], dtype=np.uint64))
    view = h.buffer_view(hk.TierKind.GPU, 0, "ssm_state")
    t = torch.from_dlpack(view)
    assert t.is_cuda and t.shape[1] > 0
    pattern = torch.arange(t.shape[1], device="cuda", dtype=t.dtype)
    t[int(state[0])].copy_(pattern)
    torch.cuda.synchronize()
    h.suspend(1)
    h.take_iteration_stats()
    # Other requests commit snapshots into the GPU state pool until request 1's state moves to
    # the host tier (max_batch bounds the living caches: each is freed after its step). Their
    # snapshots are cheap (40 tokens each: snapshot pricing) and go first; the suspended state
    # goes once it has waited long enough.
    offloaded = 0
    for rid in range(2, 80):
        h.add_request(rid, list(range(rid * 50, rid * 50 + 40)))
        h.resume(rid)
        h.resize(rid, 40, 0)
        h.resize(rid, 40, 40)
        h.commit_at_snapshot(rid)
        h.free_request(rid)
        offloaded += h.take_iteration_stats()["bytes_offloaded"]
    assert offloaded > 0
    h.resume(1)
    assert h.take_iteration_stats()["bytes_onboarded"] > 0
    state, _, _ = h.decode_step(np.array([1], dtype=np.uint64))
    h.synchronize()
    t = torch.from_dlpack(h.buffer_view(hk.TierKind.GPU, 0, "ssm_state"))
    assert torch.equal(t[int(state[0])], pattern)
    # The host tier is pinned host memory: a numpy view.
    assert isinstance(h.pool_view(hk.TierKind.HOST, 0), np.ndarray)


def test_step_buffers_are_fixed_device_arrays_a_growing_batch_refills():
    """Issue 32 item 6: the step's index buffers live on the GPU at fixed addresses (a CUDA graph
    can capture kernels that read them); each fill_step writes its step there with one copy."""
    h = cuda_manager(gpu=512 << 20, host=1 << 30)
    state, replay, tables, groups = h.step_buffers()
    ts, tt = torch.from_dlpack(state), torch.from_dlpack(tables)
    assert ts.is_cuda and tt.is_cuda and tt.shape[0] == 2 and len(groups) > 0
    addresses = (ts.data_ptr(), tt.data_ptr())
    for n in (1, 2):
        rid = n
        h.add_request(rid, list(range(rid * 100, rid * 100 + 40 * rid)))
        h.resume(rid)
        h.resize(rid, 40 * rid, 0)
        h.resize(rid, 40 * rid, 40 * rid)
        ids = list(range(1, n + 1))
        host_state, _, host_tables = h.decode_step(ids, group=groups[0])
        h.fill_step(ids)
        torch.cuda.synchronize()
        again = h.step_buffers()  # DLPack capsules: each is consumed once
        state_now, tables_now = torch.from_dlpack(again[0]), torch.from_dlpack(again[2])
        assert (state_now.data_ptr(), tables_now.data_ptr()) == addresses
        assert state_now[:n].cpu().tolist() == list(host_state)
        for r in range(n):
            row = tables_now[r, 0].cpu().tolist()
            width = len(h.block_table(ids[r], groups[0]))
            assert row[:width] == list(host_tables[r][:width])
            assert all(x == -1 for x in row[width:])
