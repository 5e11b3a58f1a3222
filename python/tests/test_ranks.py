"""Several tensor-parallel ranks in one HybridCacheManager (issue 34 item 3, from Python): each
rank's pools in its own memory (HOST: host memory per rank; CUDA: one device per rank), one set
of tables for all, every copy run on every rank."""

from pathlib import Path

import numpy as np
import pytest

import hybridkv as hk

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = str(ROOT / "models" / "nemotron_h_8b.json")


def manager(devices, backend=hk.BackendKind.HOST):
    tiers = [hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=1 << 30),
             hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=1 << 30)]
    serving = hk.ServingConfig(tokens_per_block=16, max_batch=4, tiers=tiers,
                               snapshots=hk.SnapshotPolicy(periodic_interval=64))
    return hk.HybridCacheManager(hk.read_model_config(NEMOTRON, tp=8), serving, backend,
                                 devices=devices)


def test_each_rank_keeps_its_own_bytes_through_a_snapshot_and_a_resume():
    h = manager([0, 0])
    assert h.ranks == 2
    views = [h.buffer_view(hk.TierKind.GPU, 0, "ssm_state", rank=r) for r in range(2)]
    assert views[0].ctypes.data != views[1].ctypes.data  # each rank its own memory
    written = snapshot_and_resume(h, views.__getitem__, lambda v, slot, x: v.__setitem__(
        (slot, slice(0, 8)), x), lambda v, slot: [float(x) for x in v[slot, :8]])
    assert written == [[10.0] * 8, [20.0] * 8]


def snapshot_and_resume(h, view, write, read):
    """Prefills a prompt in 64-token chunks, each rank's kernel writing its own values into the
    live state; the snapshot at 192 is copied on every rank; a prompt that diverges at 200
    resumes from it (copied back into its live slot on every rank). Returns what each rank
    holds there."""
    prompt = list(range(100, 400))
    h.add_request(1, prompt)
    h.resume(1)
    while h.request(1)["history"] < 256:
        upto = h.next_snapshot_point(1)
        h.resize(1, upto, h.request(1)["history"])
        for r in range(h.ranks):
            write(view(r), h.state_index(1), 10.0 * (r + 1) if upto == 192 else -1.0)
        h.resize(1, upto, upto)
        h.commit_at_snapshot(1)
        h.synchronize()  # the snapshot's copy runs before the next chunk's kernel writes
    h.free_request(1)
    h.add_request(2, prompt[:200] + [7] * 40)
    assert h.request(2)["reused_tokens"] == 192
    h.resume(2)
    h.synchronize()
    return [read(view(r), h.state_index(2)) for r in range(h.ranks)]


def test_every_rank_gets_the_same_step_and_a_missing_rank_is_named():
    h = manager([0, 0])
    for rid in (1, 2):
        h.add_request(rid, list(range(1000 * rid, 1000 * rid + 64)))
        h.resume(rid)
        h.resize(rid, 64, 64)
    h.fill_step([1, 2])
    first = [np.array(a) for a in h.step_buffers(rank=0)[:3]]
    second = [np.array(a) for a in h.step_buffers(rank=1)[:3]]
    for a, b in zip(first, second):
        assert np.array_equal(a, b)
    assert list(first[0][:2]) == [h.state_index(1), h.state_index(2)]
    with pytest.raises(ValueError, match="streams has 1 entries; the manager has 2 ranks"):
        h.fill_step([1, 2], streams=[0])
    for call in (lambda: h.buffer_view(hk.TierKind.GPU, 0, "ssm_state", rank=2),
                 lambda: h.pool_view(hk.TierKind.GPU, 0, rank=2),
                 lambda: h.step_buffers(rank=2),
                 lambda: h.reset_replay(rank=2)):
        with pytest.raises(ValueError, match="rank 2; the manager has 2 ranks"):
            call()


def test_one_rank_by_default():
    h = manager([])
    assert h.ranks == 1
    with pytest.raises(ValueError, match="rank 1; the manager has 1 ranks"):
        h.buffer_view(hk.TierKind.GPU, 0, "ssm_state", rank=1)


@pytest.mark.gpu
def test_two_ranks_on_the_gpus_keep_their_bytes():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    devices = [0, 1] if torch.cuda.device_count() >= 2 else [0, 0]
    try:
        h = manager(devices, hk.BackendKind.CUDA)
    except ValueError as e:
        pytest.skip(f"cuda backend unavailable: {e}")
    views = [torch.from_dlpack(h.buffer_view(hk.TierKind.GPU, 0, "ssm_state", rank=r))
             for r in range(2)]
    assert [v.device.index for v in views] == devices

    def write(v, slot, x):
        v[slot, :8] = x
        torch.cuda.synchronize()

    def read(v, slot):
        torch.cuda.synchronize()
        return v[slot, :8].cpu().tolist()

    assert snapshot_and_resume(h, views.__getitem__, write, read) == [[10.0] * 8, [20.0] * 8]
