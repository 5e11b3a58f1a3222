"""Issue 33's fleet table: `hybridkv sim` on the whole conversation trace (none backend, fp8
snapshots, every other setting at its default), four instances of GPU 16 + host 64 GiB each,
routed at random or by prefix, without and with a shared tier of 256 GiB (modelled in memory);
against one instance of 16 + 64 GiB and one with all the memory (64 + 256 GiB).

    python3 bench/fleet_matrix.py [--jobs 2] [--trace ../shared/traces/...] [--shared 256GiB]
"""
import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reuse_matrix import run  # one `hybridkv sim --json` run: its report

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"Nemotron-H-8B": "models/nemotron_h_8b.json",
          "Qwen3-Next-80B-A3B": "models/qwen3_next_80b_a3b.json"}
EACH = ["--gpu-quota", "16GiB", "--host-quota", "64GiB", "--snapshot-dtype", "fp8"]
ALL = ["--gpu-quota", "64GiB", "--host-quota", "256GiB", "--snapshot-dtype", "fp8"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" /
                                           "mooncake_conversation_trace.jsonl"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shared", default="256GiB")
    args = ap.parse_args()
    rows = {"1 instance, 16 + 64 GiB": EACH, "1 instance, all the memory (64 + 256 GiB)": ALL}
    for router in ("random", "prefix"):
        fleet = [*EACH, "--instances", "4", "--router", router]
        rows[f"4 instances, {router}"] = fleet
        rows[f"4 instances, {router}, shared {args.shared}"] = [*fleet, "--shared-quota",
                                                                  args.shared]
    jobs = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, model in MODELS.items():
            for row, flags in rows.items():
                jobs[(name, row)] = pool.submit(run, args.trace, model, flags, [])
    print("| model | run | reused tokens | of prompt | per instance | shared tier: published, "
          "fetched, tokens brought in, store at the end |")
    print("|---|---|---:|---:|---|---|")
    for name in MODELS:
        for row in rows:
            j = jobs[(name, row)].result()
            reused, prompt = j["reused_tokens"], j["prompt_tokens"]
            each = j.get("per_instance", [])
            split = " + ".join(f"{one['reused_tokens']:,}" for one in each) or "-"
            tier = "-"
            if each and "shared" in each[0]:
                s = [one["shared"] for one in each]
                tier = (f"{sum(x['bytes_published'] for x in s) / 2**30:,.0f} GiB, "
                        f"{sum(x['bytes_fetched'] for x in s) / 2**30:,.1f} GiB, "
                        f"{sum(x['hit_tokens'] for x in s):,} tokens, "
                        f"{j['shared_store']['bytes'] / 2**30:,.0f} GiB "
                        f"({j['shared_store']['evictions']:,} evicted)")
            print(f"| {name} | {row} | {reused:,} | {reused / prompt:.3f} | {split} | {tier} |",
                  flush=True)


if __name__ == "__main__":
    main()
