"""Issue 12's reuse matrix: `hybridkv sim` on the whole conversation trace (none backend), the
share of attention-only reuse at the same bytes for each feature switched on alone and all
together, per model and memory size. Prints Markdown tables.

    python3 bench/reuse_matrix.py [--jobs 2] [--trace ../shared/traces/...] [--vllm]

--vllm: the conditions of the vLLM comparison instead (--max-batch 1, one GPU tier, no host).
"""

import argparse
import json
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "build" / "release" / "hybridkv"
MODELS = {"Nemotron-H-8B": "models/nemotron_h_8b.json",
          "Qwen3-Next-80B-A3B": "models/qwen3_next_80b_a3b.json"}
# Every feature off, then one at a time, then all together (the defaults) per snapshot dtype.
OFF = ["--eviction", "lru", "--rebalance", "off", "--snapshot-dtype", "fp32",
       "--colder-copies", "drop"]
NO_COPIES = ["--colder-copies", "drop"]
COLUMNS = {
    "none": OFF,
    "snapshot-aware eviction": ["--eviction", "snapshot-aware", "--rebalance", "off", *NO_COPIES],
    "priced eviction": ["--eviction", "priced", "--rebalance", "off", *NO_COPIES],
    "rebalance": ["--eviction", "lru", "--rebalance", "on", *NO_COPIES],
    "bf16": ["--eviction", "lru", "--rebalance", "off", "--snapshot-dtype", "bf16", *NO_COPIES],
    "fp8": ["--eviction", "lru", "--rebalance", "off", "--snapshot-dtype", "fp8", *NO_COPIES],
    "kept host copies": ["--eviction", "lru", "--rebalance", "off"],
    "all, fp32": [],
    "all, bf16": ["--snapshot-dtype", "bf16"],
    "all, fp8": ["--snapshot-dtype", "fp8"],
}


def run(trace, model, quotas, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [str(CLI), "sim", "--model", model, "--trace", trace, "--quiet", "--json", f.name,
               *quotas, *extra]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" /
                                           "mooncake_conversation_trace.jsonl"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--vllm", action="store_true")
    args = ap.parse_args()
    if args.vllm:
        sizes = {"240 GiB": ["--gpu-quota", "240GiB", "--max-batch", "1"],
                 "80 GiB": ["--gpu-quota", "80GiB", "--max-batch", "1"]}
    else:
        sizes = {"GPU 40 + host 200 GiB": ["--gpu-quota", "40GiB", "--host-quota", "200GiB"],
                 "GPU 16 + host 64 GiB": ["--gpu-quota", "16GiB", "--host-quota", "64GiB"]}
    jobs = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, model in MODELS.items():
            for size, quotas in sizes.items():
                jobs[(name, size, "attention-only")] = pool.submit(
                    run, args.trace, model, quotas, ["--attention-only"])
                for column, extra in COLUMNS.items():
                    jobs[(name, size, column)] = pool.submit(run, args.trace, model, quotas, extra)
    print("| model | memory | attention-only | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---:|" + "---:|" * len(COLUMNS))
    for name in MODELS:
        for size in sizes:
            base = jobs[(name, size, "attention-only")].result()["reused_tokens"]
            cells = []
            for column in COLUMNS:
                reused = jobs[(name, size, column)].result()["reused_tokens"]
                cells.append(f"{reused:,} ({reused / base:.3f})")
            print(f"| {name} | {size} | {base:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
