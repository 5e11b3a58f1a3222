"""Per family: hybridkv.hf against the model's own cache (transformers' generate), the figures
the equivalence tests check, and the drift of resuming from reduced-precision snapshots.

    PYTHONPATH=build/release/python build/venv/bin/python bench/hf_report.py [--device cuda]

Rows: tokens compared and the largest logit difference per scenario (one request, prefix reuse,
suspend/resume, chunked prefill, speculative decoding), prompt tokens reused (never recomputed),
and, resuming from a snapshot stored in bf16 or fp8 (e4m3 blocks with a power-of-two scale)
instead of fp32, the largest logit drift and the greedy agreement over 256 teacher-forced
tokens. Prints a Markdown table.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
import hf_models as hm  # noqa: E402

import hybridkv as hk  # noqa: E402
from hybridkv.hf import PagedModel  # noqa: E402

NEW = 32


def diff(a, b):
    return (a.cpu() - b.cpu()).abs().max().item()


def single(model, kind):
    pm = PagedModel(model, backend=kind, gpu_bytes=2 << 20)
    p = hm.prompt(64, seed=1)
    pm.add_request(1, p)
    tokens, logits = pm.generate(1, NEW)
    ref_tokens, ref_logits = hm.reference(model, p, NEW)
    return tokens == ref_tokens, diff(logits, ref_logits)


def reuse(model, kind):
    pm = PagedModel(model, backend=kind, gpu_bytes=2 << 20)
    first = hm.prompt(96, seed=2)
    hm.serve(pm, 1, first, 4)
    second = first[:80] + hm.prompt(16, seed=3)
    reused = pm.add_request(2, second)
    before = pm.forward_tokens
    tokens, logits = pm.generate(2, NEW)
    computed = pm.forward_tokens - before - (NEW - 1)
    ref_tokens, ref_logits = hm.reference(model, second, NEW)
    return tokens == ref_tokens, diff(logits, ref_logits), reused, computed


def chunked(model, kind):
    pm = PagedModel(model, backend=kind, gpu_bytes=2 << 20)
    p = hm.prompt(70, seed=5)
    pm.add_request(1, p)
    tokens, logits = pm.generate(1, NEW, chunk=7)
    ref_tokens, ref_logits = hm.reference(model, p, NEW)
    return tokens == ref_tokens, diff(logits, ref_logits)


def speculative(model, kind):
    pm = PagedModel(model, backend=kind, gpu_bytes=2 << 20, num_spec_tokens=3)
    p = hm.prompt(64, seed=6)
    ref_tokens, ref_logits = hm.reference(model, p, NEW + 4)
    pm.add_request(1, p)
    tokens, logits, acc, rej = hm.speculate(pm, 1, ref_tokens, NEW)
    n = min(len(tokens), NEW + 4)
    same = tokens[:n] == ref_tokens[:n]
    return same, diff(logits[:n], ref_logits[:n]), acc, rej


def snapshot_drift(model, kind, dtype, steps=256):
    """Request 2 resumes from request 1's snapshot (stored in `dtype`), then is teacher-forced
    with the reference's tokens: the largest logit difference and the greedy agreement."""
    pm = PagedModel(model, backend=kind, gpu_bytes=8 << 20, host_bytes=64 << 20,
                    snapshot_dtype=dtype)
    first = hm.prompt(64, seed=8)
    hm.serve(pm, 1, first, 2)
    second = first[:48] + hm.prompt(16, seed=9)
    reused = pm.add_request(2, second)
    ref_tokens, ref_logits = hm.reference(model, second, steps)
    logits = [pm.prefill(2)]
    for t in ref_tokens[:-1]:
        logits.append(pm.decode(2, t))
    logits = torch.stack(logits)
    agree = (logits.argmax(-1).cpu() == torch.tensor(ref_tokens)).float().mean().item()
    return reused, diff(logits, ref_logits), agree


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    kind = hk.BackendKind.CUDA if args.device == "cuda" else hk.BackendKind.HOST
    print(f"| family | one request | prefix reuse (reused / computed prompt tokens) "
          f"| chunked prefill "
          f"| speculative (accepted / rejected drafts) | bf16 snapshot: drift, agreement over 256 "
          f"| fp8 snapshot: drift, agreement | fp32 snapshot: drift, agreement |")
    print("|---|---|---|---|---|---|---|---|")
    for family in hm.FAMILIES:
        model = hm.make_model(family, args.device)
        s_ok, s_d = single(model, kind)
        r_ok, r_d, reused, computed = reuse(model, kind)
        c_ok, c_d = chunked(model, kind)
        v_ok, v_d, acc, rej = speculative(model, kind)
        cells = [f"{'same' if s_ok else 'DIFFER'} {NEW} tok, {s_d:.2e}",
                 f"{'same' if r_ok else 'DIFFER'} {NEW} tok, {r_d:.2e} ({reused} / {computed})",
                 f"{'same' if c_ok else 'DIFFER'} {NEW} tok, {c_d:.2e}",
                 f"{'same' if v_ok else 'DIFFER'} {NEW} tok, {v_d:.2e} ({acc} / {rej})"]
        if family in hm.RECURRENT:
            # None: snapshots in the state dtype (fp32)
            for dtype in (hk.DType.BF16, hk.DType.FP8_E4M3, None):
                reused_at, d, agree = snapshot_drift(model, kind, dtype)
                cells.append(f"{d:.2e}, {agree:.1%} (from {reused_at})")
        else:
            cells += ["no recurrent state"] * 3
        print(f"| {family} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
