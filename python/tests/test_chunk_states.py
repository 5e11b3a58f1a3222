"""States inside a prefill chunk (issue 35): a chunked kernel writes the recurrent state at
periodic points inside one chunk into GPU slots the manager reserved; the commit publishes them
as snapshots, and a later request that diverges inside the chunk resumes from those bytes."""

from pathlib import Path

import numpy as np
import pytest

import hybridkv as hk
from test_manager_api import small_manager_config  # one recurrent and one attention layer

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = str(ROOT / "models" / "nemotron_h_8b.json")


def manager(chunk_states=True, backend=hk.BackendKind.HOST):
    snapshots = hk.SnapshotPolicy(periodic_interval=64, chunk_states=chunk_states)
    serving = hk.ServingConfig(tokens_per_block=16, max_batch=4, snapshots=snapshots,
                               tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=4 << 30)])
    return hk.HybridCacheManager(hk.read_model_config(NEMOTRON, tp=8), serving, backend)


class HostRows:
    """A layer's SSM state rows in host memory (numpy)."""

    def __init__(self, h):
        self.view = h.buffer_view(hk.TierKind.GPU, 0, "ssm_state")

    def write(self, slot, value):
        self.view[slot, :4] = value

    def read(self, slot):
        return [float(x) for x in self.view[slot, :4]]


class CudaRows:
    """The same rows on the GPU (torch over the DLPack view)."""

    def __init__(self, h, torch):
        self.t = torch.from_dlpack(h.buffer_view(hk.TierKind.GPU, 0, "ssm_state"))
        self.torch = torch

    def write(self, slot, value):
        self.t[slot, :4] = value
        self.torch.cuda.synchronize()

    def read(self, slot):
        self.torch.cuda.synchronize()
        return [float(x) for x in self.t[slot, :4].cpu()]


def cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        h = manager(backend=hk.BackendKind.CUDA)
    except ValueError as e:
        pytest.skip(f"cuda backend unavailable: {e}")
    return h, CudaRows(h, torch)


def test_states_written_inside_a_chunk_are_resumed_from_with_their_bytes():
    h = manager()
    states_inside_a_chunk(h, HostRows(h))


@pytest.mark.gpu
def test_states_written_inside_a_chunk_on_the_gpu():
    states_inside_a_chunk(*cuda_or_skip())


def states_inside_a_chunk(h, rows):
    prompt = list(range(1000, 1400))
    h.add_request(1, prompt)
    h.resume(1)
    end = h.next_snapshot_point(1)
    assert end == 400  # periodic points no longer end chunks: one chunk for the whole prompt
    h.resize(1, end, 0)
    states = h.reserve_chunk_states(1, end)
    assert [p for p, _ in states] == [64, 128, 192, 256, 320, 384]
    slots = [s for _, s in states]
    live = h.state_index(1)
    assert len(set(slots)) == len(slots) and live not in slots
    for point, slot in states:  # the kernel: the state after `point` tokens
        rows.write(slot, point)
    rows.write(live, end)
    h.resize(1, end, end)
    h.commit_at_snapshot(1)
    h.free_request(1)

    h.add_request(2, prompt[:200] + [7] * 50)  # diverges inside the chunk, after point 192
    assert h.request(2)["reused_tokens"] == 192
    h.resume(2)
    h.synchronize()  # the backend copies on its own thread (host) or stream (cuda)
    assert rows.read(h.state_index(2)) == [192.0] * 4


def test_without_chunk_states_nothing_is_reserved_and_bad_input_is_named():
    h = manager(chunk_states=False)
    h.add_request(1, list(range(400)))
    h.resume(1)
    end = h.next_snapshot_point(1)
    assert end == 64  # a periodic point ends the chunk instead
    h.resize(1, end, 0)
    assert h.reserve_chunk_states(1, end) == []
    with pytest.raises(KeyError, match="9"):
        h.reserve_chunk_states(9, 64)


def small_manager():
    return hk.KvCacheManager.create(small_manager_config())


def test_a_kv_cache_reserves_states_and_a_commit_at_one_publishes_it():
    m = small_manager()
    prompt = list(range(100, 180))
    a = m.create_kv_cache(prompt)
    a.resume()
    a.resize(64, 0)
    assert a.reserve_states([32, 48]) == [32, 48]
    slots = a.reserved_state_slots(0)
    assert len(slots) == 2 and len(set(slots)) == 2 and a.state_index(0) not in slots
    with pytest.raises(ValueError, match="40"):
        a.reserve_states([40])  # not a multiple of tokens_per_block
    assert a.reserved_state_slots(0) == slots  # a refused call changes nothing
    a.resize(64, 64)
    a.commit(prompt[:32], role=hk.SnapshotRole.SPECULATIVE)  # the state reserved at 32
    a.commit(prompt[32:64])
    assert a.reserved_state_slots(0) == []  # released by the commits through their points
    b = m.create_kv_cache(prompt[:40] + [1] * 20)
    assert b.reused_tokens == 32
    a.close()
    b.close()
