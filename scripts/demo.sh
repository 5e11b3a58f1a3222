#!/usr/bin/env bash
# The demo: builds the hybridkv CLI and replays the bundled Mooncake slice (1,000 real requests)
# through the cache of Nemotron-H-8B (TP 8) on the host backend: real bytes, real tier moves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
echo "demo: building the hybridkv CLI in build/release (a few minutes the first time)"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
log=$(mktemp)
if ! cmake --build build/release -j "$(nproc)" --target hybridkv_cli >"$log" 2>&1; then
  cat "$log"; exit 1
fi
echo "demo: hybridkv sim on 1,000 requests, GPU tier 2 GiB + host tier 4 GiB (host memory)"
./build/release/hybridkv sim --model models/nemotron_h_8b.json \
  --trace data/mooncake_conversation_first1000.jsonl --backend host --tp 8 \
  --gpu-quota 2GiB --host-quota 4GiB --max-batch 16 --compare \
  --svg build/release/sim.svg "$@"
