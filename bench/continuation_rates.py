"""How often a later request extends a prompt, by how much of that prompt was itself reused
from an earlier prompt's end (the figures behind PrefixIndex::continuation_prior).

Unlimited memory, block level (512-token hash ids): a prompt "ends" at its last full block
(aligned-end:512). A request R continues an earlier prompt P when the deepest such end on R's
matched path is P's and lies at least 2 blocks deep. For each prompt, its own share is the depth
of the end it continued (0 if none) over its length. The last 2,000 requests are left out
(their next turns may fall past the end of the trace).

    python3 bench/continuation_rates.py [--trace ../shared/traces/...]
"""

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 512


def continuation_rates(requests, tail=2000):
    root = {}
    continued = [False] * len(requests)
    share = [0.0] * len(requests)
    for k, r in enumerate(requests):
        ids, length = r["hash_ids"], r["input_length"]
        last_full = length // BLOCK if length % BLOCK else length // BLOCK - 1
        node, path = root, []
        for x in ids:
            if x not in node:
                break
            node = node[x]
            path.append(node)
        for depth in range(min(len(path), last_full), 1, -1):
            end = path[depth - 1].get("#end")
            if end is not None:
                continued[end] = True
                share[k] = depth * BLOCK / length
                break
        node = root
        for i, x in enumerate(ids):
            node = node.setdefault(x, {})
            if i + 1 == last_full:
                node["#end"] = k
    buckets = {}
    for k in range(max(0, len(requests) - tail)):
        b = min(int(share[k] * 10), 9)
        n, c = buckets.get(b, (0, 0))
        buckets[b] = (n + 1, c + continued[k])
    return buckets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" /
                                           "mooncake_conversation_trace.jsonl"))
    args = ap.parse_args()
    requests = [json.loads(line) for line in open(args.trace)]
    print("| own prompt reused from an earlier end | prompts | continued later |")
    print("|---|---:|---:|")
    for b, (n, c) in sorted(continuation_rates(requests).items()):
        print(f"| {b / 10:.1f} - {(b + 1) / 10:.1f} | {n:,} | {c / n:.3f} |")


if __name__ == "__main__":
    main()
