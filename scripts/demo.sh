#!/usr/bin/env bash
# The demo: builds the hybridkv CLI and replays the bundled Mooncake slice (1,000 real requests)
# through the cache of Nemotron-H-8B (TP 8) on the host backend: real bytes, real tier moves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
log=$(mktemp)
if ! cmake --build build/release -j "$(nproc)" --target hybridkv_cli >"$log" 2>&1; then
  cat "$log"; exit 1
fi
./build/release/hybridkv sim --model models/nemotron_h_8b.json \
  --trace data/mooncake_conversation_first1000.jsonl --backend host --tp 8 \
  --gpu-quota 2GiB --host-quota 4GiB --max-batch 16 \
  --snapshot-policy branch,demand,periodic:2048 --svg build/release/sim.svg "$@"
