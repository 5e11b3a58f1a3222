"""Issue 36: a property-based fuzzer of the Python boundary (hypothesis).

Random sequences of calls on one HybridCacheManager (requests sharing prefixes, prefill at
snapshot points, decode steps, suspend / resume, quotas), with ids and arrays of every dtype and
layout, capacities up to 2^64 - 1 and unknown or duplicate ids. After every call:
- a call that raised raised one of the library's exceptions (never a crash, MemoryError or
  SystemError) and changed nothing (the testing library's snapshot, before and after);
- every invariant holds (hybridkv_testing's check);
- ACTIVE requests never share a state slot nor a block they are about to write;
- no call took longer than a bound (a hang shows as a failure, not as a stuck CI).

Budget: HKV_FUZZ_EXAMPLES sequences (CI: 300, about 20 s) of up to HKV_FUZZ_STEPS calls (40);
the counts go to HKV_FUZZ_REPORT (as the run goes) and are printed at its end. hypothesis keeps
every sequence it explored in memory (about 2 GB after an hour): long runs are best repeated.
`HKV_FUZZ_EXAMPLES=5000 pytest python/tests/test_fuzz_boundary.py` runs longer on demand.
"""

import os
import time
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402

import hybridkv as hk  # noqa: E402
from hybridkv._hybridkv import testing  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = str(ROOT / "models" / "nemotron_h_8b.json")
EXAMPLES = int(os.environ.get("HKV_FUZZ_EXAMPLES", "300"))
STEPS = int(os.environ.get("HKV_FUZZ_STEPS", "40"))
CALL_BOUND_S = 5.0  # generous: every call here takes micro- to milliseconds
LIBRARY_ERRORS = (ValueError, KeyError, TypeError, hk.OutOfPagesError, hk.RefusedError,
                  hk.HybridKvError)
COUNTS = {"calls": 0, "raised": 0, "sequences": 0, "seconds": 0.0}
MODEL = hk.read_model_config(NEMOTRON, tp=8)
PREFIXES = [list(range(1000 * k, 1000 * k + 96)) for k in range(3)]

ids_strategy = st.integers(min_value=0, max_value=7)
wild_u64 = st.one_of(st.integers(0, 600), st.integers(0, 2**64 - 1),
                     st.sampled_from([2**31 - 1, 2**31, 2**32, 2**63, 2**64 - 1]))


def id_container(draw_ids, form):
    """The same ids as the caller might pass them: every dtype and layout."""
    if form == "list":
        return list(draw_ids)
    if form == "tuple":
        return tuple(draw_ids)
    if form == "uint64":
        return np.array(draw_ids, np.uint64)
    if form == "strided":
        return np.repeat(np.array(draw_ids, np.uint64), 2)[::2]
    if form == "int64":
        return np.array(draw_ids, np.int64)
    if form == "int32":
        return np.array(draw_ids, np.int32)
    if form == "float":
        return np.array(draw_ids, np.float64) + 0.5
    if form == "2d":
        return np.array([draw_ids], np.uint64)
    if form == "floats_list":
        return [float(i) for i in draw_ids]
    if form == "readonly":
        a = np.array(draw_ids, np.uint64)
        a.flags.writeable = False
        return a
    return str(draw_ids)


class BoundaryMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        serving = hk.ServingConfig(
            max_batch=6, tokens_per_block=16, snapshots=hk.SnapshotPolicy(periodic_interval=32),
            tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=128 << 20,
                                 max_quota_bytes=256 << 20),
                   hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=64 << 20)])
        self.h = hk.HybridCacheManager(MODEL, serving, hk.BackendKind.NONE)
        self.prompts = {}
        COUNTS["sequences"] += 1

    # Every call goes through here: timed, checked, and a raised call must change nothing.
    def call(self, fn, *args):
        before = testing.debug_snapshot(self.h)
        start = time.monotonic()
        raised = None
        try:
            result = fn(*args)
        except LIBRARY_ERRORS as e:
            raised = e
            result = None
        elapsed = time.monotonic() - start
        COUNTS["calls"] += 1
        COUNTS["seconds"] += elapsed
        assert elapsed < CALL_BOUND_S, f"{fn.__name__}{args!r:.200} took {elapsed:.1f} s"
        if raised is not None:
            COUNTS["raised"] += 1
            assert str(raised), f"{fn.__name__} raised {type(raised).__name__} with no message"
            after = testing.debug_snapshot(self.h)
            assert after == before, f"{fn.__name__}{args!r:.200} raised ({raised}) yet changed state"
        return result

    @rule(rid=ids_strategy, prefix=st.integers(0, 2), extra=st.integers(0, 80))
    def add_request(self, rid, prefix, extra):
        prompt = PREFIXES[prefix][: 32 + extra] + [rid] * (extra % 7)
        self.call(self.h.add_request, rid, prompt)
        if rid not in self.prompts and self.h.num_requests and self._exists(rid):
            self.prompts[rid] = prompt

    def _exists(self, rid):
        try:
            self.h.request(rid)
            return True
        except KeyError:
            return False

    def _active(self):
        return [r for r in range(8) if self._exists(r)
                and self.h.request(r)["state"] == hk.CacheState.ACTIVE]

    @rule(rid=ids_strategy, prefix=st.integers(0, 2), extra=st.integers(0, 80))
    def start(self, rid, prefix, extra):
        """The common path: a request arrives, runs and prefills its prompt."""
        self.add_request(rid, prefix, extra)
        self.call(self.h.resume, rid)
        for _ in range(4):
            self.prefill_chunk(rid)

    @rule(steps=st.integers(1, 20))
    def decode_active(self, steps):
        """The common path: every ACTIVE request decodes, as an engine's step does."""
        for _ in range(steps):
            ids = self._active()
            if ids:
                self.call(self.h.decode_step, np.array(ids, np.uint64), 1)

    @rule(rid=ids_strategy)
    def resume(self, rid):
        self.call(self.h.resume, rid)

    @rule(rid=ids_strategy)
    def suspend(self, rid):
        self.call(self.h.suspend, rid)

    @rule(rid=ids_strategy)
    def free_request(self, rid):
        self.call(self.h.free_request, rid)
        if not self._exists(rid):
            self.prompts.pop(rid, None)

    @rule(rid=ids_strategy, capacity=wild_u64, history=wild_u64)
    def resize(self, rid, capacity, history):
        self.call(self.h.resize, rid, capacity, history)

    @rule(rid=ids_strategy)
    def prefill_chunk(self, rid):
        if not self._exists(rid) or self.h.request(rid)["state"] != hk.CacheState.ACTIVE:
            return
        done = self.h.request(rid)["history"]
        end = self.call(self.h.next_snapshot_point, rid)
        if end is None or end <= done:
            return
        self.call(self.h.resize, rid, end, done)
        self.call(self.h.resize, rid, end, end)
        self.call(self.h.commit_at_snapshot, rid)

    @rule(ids=st.lists(ids_strategy, max_size=6),
          form=st.sampled_from(["list", "tuple", "uint64", "strided", "int64", "int32", "float",
                                "2d", "floats_list", "readonly", "str"]),
          group=st.sampled_from([None, 0, 1, 2, 99]))
    def decode_step(self, ids, form, group):
        result = self.call(self.h.decode_step, id_container(ids, form), group)
        if result is not None:
            state, replay, tables = result
            assert len(state) == len(ids) == len(replay) == tables.shape[0]
            assert len(set(ids)) == len(ids), "a step with a duplicate id ran"

    @rule(rid=ids_strategy, n=st.integers(0, 40))
    def commit_answer(self, rid, n):
        self.call(self.h.commit_answer, rid, list(range(5000, 5000 + n)))

    @rule(quota=st.sampled_from([1 << 20, 64 << 20, 128 << 20, 200 << 20, 256 << 20, 1 << 40]))
    def set_quota(self, quota):
        self.call(self.h.set_quota, hk.TierKind.GPU, quota)

    @rule(rid=st.one_of(st.none(), ids_strategy))
    def scan(self, rid):
        self.call(self.h.scan_non_finite, rid)

    @invariant()
    def invariants_hold(self):
        assert testing.check_invariants(self.h) == ""

    @invariant()
    def active_requests_write_nothing_shared(self):
        states, writable = {}, {}
        for rid in range(8):
            if not self._exists(rid):
                continue
            r = self.h.request(rid)
            if r["state"] != hk.CacheState.ACTIVE:
                continue
            s = self.h.state_index(rid)
            assert s not in states, f"requests {states.get(s)} and {rid} share state slot {s}"
            states[s] = rid
            table = self.h.block_table(rid, 1)
            for b in range(r["history"] // 16, len(table)):  # blocks the next step writes
                slot = table[b]
                if slot < 0:
                    continue
                assert slot not in writable, f"requests {writable[slot]} and {rid} write slot {slot}"
                writable[slot] = rid

    def teardown(self):
        for rid in range(8):
            if self._exists(rid):
                self.h.free_request(rid)
        assert testing.check_invariants(self.h) == ""
        if COUNTS["sequences"] % 200 == 0:  # a long run stopped by a timeout keeps its counts
            report()


BoundaryMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=False,
    database=None, suppress_health_check=list(HealthCheck), print_blob=True)
test_python_boundary_fuzz = BoundaryMachine.TestCase


def report():
    line = (f"fuzz: {COUNTS['sequences']} sequences, {COUNTS['calls']} calls "
            f"({COUNTS['raised']} refused), {COUNTS['seconds']:.3f} s inside calls")
    with open(os.environ.get("HKV_FUZZ_REPORT", "/tmp/hybridkv-fuzz-python.txt"), "w") as f:
        f.write(line + "\n")
    return line


def test_fuzz_counts_are_reported(record_property):
    """Runs after the fuzzer (file order): its counts, for the closing note and CI's log."""
    line = report()
    record_property("fuzz", line)
    print(line)
