"""Per family: hybridkv.hf against the model's own cache (transformers' generate), the figures
the equivalence tests check, and the drift of resuming from reduced-precision snapshots.

    PYTHONPATH=build/release/python build/venv/bin/python bench/hf_report.py \
        [--device cuda] [--dtype fp32|bf16]

Rows: tokens compared with generate() and the largest logit difference per scenario (one
request, prefix reuse, chunked prefill, speculative decoding), then "own" the largest logit
difference of every forward against the model's own cache fed the same chunks (the stricter
reference, hf_models.own_cache_replay), prompt tokens reused (never recomputed),
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


def paged(model, kind, **kw):
    pm = PagedModel(model, backend=kind, **{"gpu_bytes": 2 << 20, **kw})
    return pm, hm.ForwardLog(pm)


def single(model, kind):
    pm, log = paged(model, kind)
    p = hm.prompt(64, seed=1)
    pm.add_request(1, p)
    tokens, logits = pm.generate(1, NEW)
    ref_tokens, ref_logits = hm.reference(model, p, NEW)
    return tokens == ref_tokens, diff(logits, ref_logits), hm.own_cache_replay(model, log, 1)


def reuse(model, kind):
    pm, log = paged(model, kind)
    first = hm.prompt(96, seed=2)
    hm.serve(pm, 1, first, 4)
    second = first[:80] + hm.prompt(16, seed=3)
    reused = pm.add_request(2, second)
    before = pm.forward_tokens
    tokens, logits = pm.generate(2, NEW)
    computed = pm.forward_tokens - before - (NEW - 1)
    ref_tokens, ref_logits = hm.reference(model, second, NEW)
    own = hm.own_cache_replay(model, log, 2, prefix_of=1)
    return tokens == ref_tokens, diff(logits, ref_logits), own, reused, computed


def chunked(model, kind):
    pm, log = paged(model, kind)
    p = hm.prompt(70, seed=5)
    pm.add_request(1, p)
    tokens, logits = pm.generate(1, NEW, chunk=7)
    ref_tokens, ref_logits = hm.reference(model, p, NEW)
    return tokens == ref_tokens, diff(logits, ref_logits), hm.own_cache_replay(model, log, 1)


def speculative(model, kind):
    pm, log = paged(model, kind, num_spec_tokens=3)
    p = hm.prompt(64, seed=6)
    ref_tokens, ref_logits = hm.reference(model, p, NEW + 4)
    pm.add_request(1, p)
    tokens, logits, acc, rej = hm.speculate(pm, 1, ref_tokens, NEW)
    n = min(len(tokens), NEW + 4)
    same = tokens[:n] == ref_tokens[:n]
    own = hm.own_cache_replay(model, log, 1)
    return same, diff(logits[:n], ref_logits[:n]), own, acc, rej


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
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--families", nargs="*", default=list(hm.FAMILIES),
                    help="a subset of hf_models.FAMILIES (default: all)")
    args = ap.parse_args()
    kind = hk.BackendKind.CUDA if args.device == "cuda" else hk.BackendKind.HOST
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    print(f"{args.dtype} models on {args.device}; 'same' / 'DIFFER': the tokens against "
          f"generate(); 'own': against the model's own cache fed the same chunks\n")
    print(f"| family | one request | prefix reuse (reused / computed prompt tokens) "
          f"| chunked prefill "
          f"| speculative (accepted / rejected drafts) | bf16 snapshot: drift, agreement over 256 "
          f"| fp8 snapshot: drift, agreement | fp32 snapshot: drift, agreement |")
    print("|---|---|---|---|---|---|---|---|")
    for family in args.families:
        model = hm.make_model(family, args.device, dtype=dtype)
        s_ok, s_d, s_o = single(model, kind)
        r_ok, r_d, r_o, reused, computed = reuse(model, kind)
        c_ok, c_d, c_o = chunked(model, kind)
        v_ok, v_d, v_o, acc, rej = speculative(model, kind)

        def same(ok):
            return "same" if ok else "DIFFER"

        cells = [f"{same(s_ok)} {NEW} tok, {s_d:.2e}, own {s_o:.2e}",
                 f"{same(r_ok)} {NEW} tok, {r_d:.2e}, own {r_o:.2e} ({reused} / {computed})",
                 f"{same(c_ok)} {NEW} tok, {c_d:.2e}, own {c_o:.2e}",
                 f"{same(v_ok)} {NEW} tok, {v_d:.2e}, own {v_o:.2e} ({acc} / {rej})"]
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
