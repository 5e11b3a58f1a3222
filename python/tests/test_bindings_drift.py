"""Issue 32 (bindings that cannot drift): every field of the public C++ structs the Python module
exposes has its Python counterpart. The fields are read from the headers themselves, so a field
added in C++ without its binding fails here."""

import re
from pathlib import Path

import pytest

import hybridkv as hk

INCLUDE = Path(__file__).resolve().parents[2] / "include" / "hybridkv"
FIELD = re.compile(r"^\s*(?:std::[\w:]+<[^;()]*>|[\w:]+)\s+(\w+)\s*(?:=[^;()]*|\{[^;()]*\})?;")


def fields(header, struct):
    """The data members of `struct` in `header`, in order (methods and comments skipped)."""
    text = (INCLUDE / header).read_text()
    start = text.index(f"struct {struct} {{")
    body = text[text.index("{", start) + 1:text.index("\n};", start)]
    out = []
    for line in body.splitlines():
        line = line.split("//")[0]
        m = FIELD.match(line)
        if m and "(" not in line:
            out.append(m.group(1))
    assert out, f"no fields found in {header}: {struct}"
    return out


def started():
    model = hk.read_model_config(str(INCLUDE.parents[1] / "models" / "nemotron_h_8b.json"), tp=8)
    s = hk.ServingConfig(max_batch=4, tokens_per_block=16,
                         tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=4 << 30),
                                hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=1 << 30)])
    h = hk.HybridCacheManager(model, s, hk.BackendKind.NONE)
    h.add_request(1, list(range(40)))
    h.resume(1)
    h.resize(1, 40, 40)
    return h


def test_iteration_and_reuse_statistics_have_every_field():
    h = started()
    it = h.take_iteration_stats()
    assert set(fields("stats.h", "IterationStats")) == set(it)
    assert set(fields("stats.h", "GroupIterationStats")) == set(it["groups"][0])
    assert set(fields("stats.h", "TierIterationStats")) == set(it["tiers"][0])
    reuse = h.reuse_stats()
    assert set(fields("reuse.h", "ReuseStats")) == set(reuse)
    assert set(fields("reuse.h", "GroupReuseStats")) == set(reuse["groups"][0])
    assert h.take_reuse_stats().keys() == reuse.keys()


@pytest.mark.parametrize("header,struct,cls", [
    ("config.h", "ManagerConfig", hk.ManagerConfig),
    ("config.h", "TierConfig", hk.TierConfig),
    ("config.h", "BufferConfig", hk.BufferConfig),
    ("config.h", "AttentionLayerConfig", hk.AttentionLayerConfig),
    ("config.h", "SsmLayerConfig", hk.SsmLayerConfig),
    ("config.h", "BatchShape", hk.BatchShape),
    ("config.h", "RequestShape", hk.RequestShape),
    ("hybrid.h", "ServingConfig", hk.ServingConfig),
    ("hybrid.h", "SnapshotPolicy", hk.SnapshotPolicy),
])
def test_config_structs_have_every_field(header, struct, cls):
    missing = [f for f in fields(header, struct) if not hasattr(cls(), f)]
    assert not missing, f"{struct} fields with no Python attribute: {missing}"


def test_the_new_config_fields_round_trip():
    c = hk.ManagerConfig(reuse_match_backoff=3, block_hash=hk.BlockHash.FAST_NON_CRYPTOGRAPHIC,
                         swa_scratch_reuse=True, max_rewind_len=8,
                         typical_step=hk.BatchShape(requests=[hk.RequestShape(capacity=64,
                                                                              history=63)]),
                         constraints=[hk.BatchShape(requests=[hk.RequestShape(capacity=32)],
                                                    shared_prefix_tokens=16)])
    assert (c.reuse_match_backoff, c.swa_scratch_reuse, c.max_rewind_len) == (3, True, 8)
    assert c.block_hash == hk.BlockHash.FAST_NON_CRYPTOGRAPHIC
    assert c.typical_step.requests[0].history == 63
    assert c.constraints[0].shared_prefix_tokens == 16


def test_the_checked_in_stub_is_what_the_module_generates(tmp_path):
    """python/hybridkv/_hybridkv.pyi is nanobind's stub of the built module (regenerate it with
    `python -m nanobind.stubgen -m hybridkv._hybridkv -o python/hybridkv/_hybridkv.pyi`, then
    drop the line that imports the tests-only `testing` submodule)."""
    stubgen = pytest.importorskip("nanobind.stubgen")
    import nanobind

    pin = next(line.split("==")[1] for line in
               (INCLUDE.parents[1] / "python" / "requirements.txt").read_text().splitlines()
               if line.startswith("nanobind=="))
    if nanobind.__version__ != pin:
        pytest.skip(f"nanobind {nanobind.__version__} is not the pinned {pin}: its stubs differ")
    out = tmp_path / "stub.pyi"
    stubgen.main(["-q", "-m", "hybridkv._hybridkv", "-o", str(out)])
    generated = [line for line in out.read_text().splitlines()
                 if line != "from . import testing as testing"]
    checked_in = (INCLUDE.parents[1] / "python" / "hybridkv" / "_hybridkv.pyi").read_text()
    assert generated == checked_in.splitlines(), "the stub is stale: regenerate it (see above)"
