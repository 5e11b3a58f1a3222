#!/usr/bin/env bash
# The demo: builds the hybridkv CLI and prints the storage plan of a bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
log=$(mktemp)
if ! cmake --build build/release -j "$(nproc)" --target hybridkv_cli >"$log" 2>&1; then
  cat "$log"; exit 1
fi
./build/release/hybridkv plan --model models/nemotron_h_8b.json --gpu-quota 40GiB \
  --host-quota 200GiB --max-batch 64 "$@"
