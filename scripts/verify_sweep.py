"""A randomized sweep of `hybridkv sim --backend host --verify`: every run draws a bundled model,
TP size, quotas, batch size, token budget, snapshot policy, speculative tokens, snapshot dtype,
offload / eviction / rebalancing / kept-copies settings and a trace (the bundled slice or a
synthetic one), and must end with 0 mismatches or a clear refusal of settings that cannot hold
their own floors. Prints one line per run (its seed replays it) and the command of any failure.
With --typical-lens, each run also draws the starting split (--typical-len) from that list (the
other draws, and so earlier seeds' settings, stay as they were).

    python3 scripts/verify_sweep.py [--seed S] [--runs N] [--cli build/release/hybridkv]
                                    [--typical-lens 1024,8192,65536]
"""

import argparse
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["aligned-end:512,branch,no-end", "end", "branch", "answer", "periodic:1024", "demand",
            "aligned-end:256,answer,no-end", "start:512,from-end:256",
            "aligned-end:512,demand,branch,no-end"]


def draw(seed, limits, typical_lens):
    r = random.Random(seed)
    models = sorted(p.name for p in (ROOT / "models").glob("*.json"))
    trace = r.choice([str(ROOT / "data" / "mooncake_conversation_first1000.jsonl"),
                      f"synthetic:200:{seed}"])
    args = ["sim", "--model", str(ROOT / "models" / r.choice(models)), "--trace", trace,
            "--limit", str(r.choice(limits)), "--backend", "host", "--verify", "--quiet",
            "--tp", str(r.choice([1, 2, 4, 8])),
            "--gpu-quota", r.choice(["256MiB", "512MiB", "1GiB", "2GiB", "4GiB"]),
            "--host-quota", r.choice(["none", "256MiB", "1GiB", "4GiB"]),
            "--max-batch", str(r.choice([1, 4, 16, 64])),
            "--max-tokens-per-step", str(r.choice([512, 2048, 8192])),
            "--snapshot-policy", r.choice(POLICIES),
            "--spec-tokens", str(r.choice([0, 0, 2, 4])),
            "--snapshot-dtype", r.choice(["fp32", "bf16", "fp8"]),
            "--offload", r.choice(["selective", "all"]),
            "--colder-copies", r.choice(["keep", "keep", "drop"]),
            "--eviction", r.choice(["priced", "snapshot-aware", "lru"]),
            "--rebalance", r.choice(["on", "off"])]
    if r.random() < 0.25:
        args += ["--arrival", "timestamps"]
    if typical_lens:
        args += ["--typical-len", str(r.choice(typical_lens))]
    return args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=random.randrange(1 << 31))
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--cli", default=str(ROOT / "build" / "release" / "hybridkv"))
    ap.add_argument("--limits", default="40,80,120", help="request counts to draw from")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--typical-lens", default="", help="starting splits to draw from (none: not drawn)")
    args = ap.parse_args()
    limits = [int(x) for x in args.limits.split(",")]
    typical_lens = [int(x) for x in args.typical_lens.split(",") if x]
    failures = 0
    for seed in range(args.seed, args.seed + args.runs):
        cmd = [args.cli, *draw(seed, limits, typical_lens)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"timeout {seed}: {' '.join(cmd)}", flush=True)
            failures += 1
            continue
        out = p.stdout + p.stderr
        if p.returncode == 2 and "raise the GPU quota" in out:
            print(f"refused {seed} (floors above the quota)", flush=True)
            continue
        verify = [line for line in out.splitlines() if line.startswith("verify")]
        if p.returncode == 0 and verify and " 0 mismatches" in verify[0]:
            print(f"ok {seed}: {verify[0][20:]}", flush=True)
            continue
        failures += 1
        print(f"FAILED {seed} rc {p.returncode}: {' '.join(cmd)}\n{out[-2000:]}", flush=True)
    print(f"{failures} failures in {args.runs} runs from seed {args.seed}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
