"""Cost of a Python decode step for 256 requests through hybridkv's batched call.

decode_step(ids, group) grows every request by one token and writes the step's state indices
and block tables into buffers the manager owns (numpy views, no per-request Python objects).
The baseline does the same per request from Python (resize + block_table copy). Nemotron-H-8B,
none backend, ~1k-token requests; prints microseconds per request-step (median of 5 runs of
200 steps). Run: PYTHONPATH=build/release/python python bench/python_decode_step.py
"""

import statistics
import time
from pathlib import Path

import numpy as np

import hybridkv as hk

ROOT = Path(__file__).resolve().parents[1]
N, STEPS, RUNS = 256, 200, 5


def manager():
    model = hk.read_model_config(str(ROOT / "models" / "nemotron_h_8b.json"))
    serving = hk.ServingConfig(max_batch=N, tiers=[hk.TierConfig(kind=hk.TierKind.GPU,
                                                                 quota_bytes=64 << 30)])
    h = hk.HybridCacheManager(model, serving, hk.BackendKind.NONE)
    for rid in range(N):
        h.add_request(rid, [rid * 7919 + i for i in range(1000)])
        h.resume(rid)
        h.resize(rid, 1000, 0)
        h.resize(rid, 1000, 1000)
    return h


def batched(h, ids):
    t = time.perf_counter()
    for _ in range(STEPS):
        state, replay, tables = h.decode_step(ids, group=1)
    return (time.perf_counter() - t) / (STEPS * N) * 1e6


def per_request(h, ids):
    t = time.perf_counter()
    for _ in range(STEPS):
        for rid in ids.tolist():
            r = h.request(rid)
            h.resize(rid, r["history"] + 1, r["history"])
            h.block_table(rid, 1)
    return (time.perf_counter() - t) / (STEPS * N) * 1e6


def main():
    ids = np.arange(N, dtype=np.uint64)
    fast = statistics.median(batched(manager(), ids) for _ in range(RUNS))
    slow = statistics.median(per_request(manager(), ids) for _ in range(RUNS))
    print(f"decode_step, {N} requests: {fast:.3f} us per request-step (batched call)")
    print(f"per-request Python loop, same run: {slow:.3f} us per request-step "
          f"({slow / fast:.1f}x the batched call)")


if __name__ == "__main__":
    main()
