#!/usr/bin/env bash
# The GPU runs of the CUDA backend, on the GPU machine (device tool), from binaries built on the
# development machine and carried in gpu_bin/ (scripts/gpu_pack.sh). Logs go to $OUT (at most 8
# files come back).
#   bash scripts/gpu_session.sh suite|suite_tests|bench|final|sanitize|racecheck|copies|pymod|hf|precision|all
set -u
OUT=${OUT:-/tmp/hkv-out}
mkdir -p "$OUT" /work
[ -e /work/main ] || ln -s "$PWD" /work/main  # the binaries name /work/main/{models,data}
B=$PWD/gpu_bin
export HYBRIDKV_TEST_BACKEND=cuda

suite() {
  suite_tests
  sanitizers
}

suite_tests() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/summary.txt"
  ls "$B" >> "$OUT/summary.txt"
  # Alone first: it measures the device's free memory, which the other suites move.
  (cd /work/main && timeout 200 "$B/cuda_backend_test" > "$OUT/cuda_backend_test.part" 2>&1
   echo "cuda_backend_test rc=$?" >> "$OUT/summary.txt")
  for t in kv_cache_test commit_test engine_calls_test eviction_order_test \
           snapshot_precision_test disk_tier_test hybrid_test reuse_test randomized_reuse_test \
           randomized_test; do
    echo "$t"
  done | xargs -P 4 -I{} bash -c "cd /work/main && TMPDIR=/var/tmp timeout 400 $B/{} > $OUT/{}.part 2>&1; echo \"{} rc=\$?\" >> $OUT/summary.txt"
  for f in "$OUT"/*.part; do echo "=== $f"; tail -c 20000 "$f"; done > "$OUT/tests.log"
  grep -h -E "^\[  (PASSED|FAILED|SKIPPED) |tests? from .* ran|^seed" "$OUT"/*.part >> "$OUT/summary.txt"
  rm -f "$OUT"/*.part
}

sanitizers() {
  for tool in memcheck racecheck; do
    echo "=== compute-sanitizer --tool $tool cuda_backend_test + kv_cache_test subset"
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$B/cuda_backend_test" 2>&1 | tail -15
    echo "rc=$?"
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$B/kv_cache_test" \
      --gtest_filter='*Suspend*:*Resume*:*Copy*' 2>&1 | tail -15
    echo "rc=$?"
  done > "$OUT/sanitizer.log" 2>&1
}

bench() {
  {
    nvcc -O2 -std=c++20 -arch=sm_90 -o /tmp/probe "$B/gpu_copy_limits.cu" && /tmp/probe
    echo; "$B/cuda_copy_bench"
  } > "$OUT/copy_bench.md" 2>&1
  mkdir -p /var/tmp/hkv-disk
  {
    df -h /var/tmp; echo
    "$B/disk_tier_bench" /var/tmp/hkv-disk cuda; echo "rc=$?"
    dd if=/dev/zero of=/var/tmp/hkv-disk/dd bs=4M count=160 oflag=direct conv=fsync 2>&1 | tail -1
    dd if=/var/tmp/hkv-disk/dd of=/dev/null bs=4M iflag=direct 2>&1 | tail -1
    rm -f /var/tmp/hkv-disk/dd
  } > "$OUT/disk_bench.md" 2>&1
  cd /work/main
  "$B/gpu_requests" models/nemotron_h_8b.json /var/tmp/hkv-disk > "$OUT/example.txt" 2>&1
  echo "example rc=$?" >> "$OUT/example.txt"
  timeout 280 "$B/hybridkv" sim --model models/nemotron_h_8b.json \
    --trace data/mooncake_conversation_first1000.jsonl --backend cuda --verify --tp 8 \
    --gpu-quota 512MiB --host-quota 1GiB --max-batch 16 --quiet --json "$OUT/sim_verify.json" \
    >> "$OUT/example.txt" 2>&1
  echo "sim rc=$?" >> "$OUT/example.txt"
}

# After a change to the copy engine: its benchmark, then the suites that exercise it most and a
# verified sim of the slice's first requests, side by side.
final() {
  "$B/cuda_copy_bench" > "$OUT/copy_bench.md" 2>&1
  (cd /work/main && timeout 300 "$B/hybridkv" sim --model models/nemotron_h_8b.json \
    --trace data/mooncake_conversation_first1000.jsonl --limit "${SIM_LIMIT:-150}" \
    --backend cuda --verify --tp 8 --gpu-quota 512MiB --host-quota 1GiB --max-batch 16 --quiet \
    --json "$OUT/sim_verify.json" > "$OUT/example.txt" 2>&1; echo "sim rc=$?" >> "$OUT/example.txt") &
  for t in cuda_backend_test kv_cache_test disk_tier_test reuse_test; do
    timeout 200 "$B/$t" > "$OUT/$t.part" 2>&1; echo "$t rc=$?" >> "$OUT/summary.txt"
  done
  timeout 250 "$B/randomized_reuse_test" --gtest_filter='*SharedPrefixes*:*Rebalancing*' \
    > "$OUT/rr.part" 2>&1
  echo "randomized_reuse_test (2 of 4) rc=$?" >> "$OUT/summary.txt"
  wait
  for f in "$OUT"/*.part; do echo "=== $f"; tail -c 6000 "$f"; done > "$OUT/tests.log"
  rm -f "$OUT"/*.part
}

# The copy benchmark, and the sanitizers over more of the GPU suite.
sanitize() {
  "$B/cuda_copy_bench" > "$OUT/copy_bench.md" 2>&1
  for run in "memcheck disk_tier_test" "memcheck reuse_test" \
             "memcheck snapshot_precision_test" "memcheck hybrid_test --gtest_filter=*nemotron*" \
             "racecheck reuse_test" "racecheck disk_tier_test"; do
    set -- $run
    tool=$1; shift
    echo "=== compute-sanitizer --tool $tool $*"
    (cd /work/main && TMPDIR=/var/tmp timeout 30 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$B/$@" 2>&1 | grep -E "PASSED|FAILED|SUMMARY|ERROR|rror" | tail -6)
  done > "$OUT/sanitizer.log" 2>&1
}

# The Python module built there (for the image's Python, CUDA on) and the Python tests on the
# cuda backend: the module's GPU tests and hybridkv.hf's equivalence tests on CUDA.
pymod() {
  local d=$B/deps
  export LD_LIBRARY_PATH=$d/lib:${LD_LIBRARY_PATH:-}
  # The image's default compiler (/opt/gcc) links libstdc++ statically: a module built so and
  # loaded next to torch (which loads the shared libstdc++) crashed in iostream's locale. The
  # system g++ links it shared.
  if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++; fi
  {
    python3 -c 'import sys, torch, transformers; print(sys.version, torch.__version__, transformers.__version__)'
    rm -rf /tmp/hkv-py
    cmake -S . -B /tmp/hkv-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYBRIDKV_PYTHON=ON \
      -DHYBRIDKV_TESTS=OFF -DHYBRIDKV_BENCH=OFF -DPython_EXECUTABLE="$(command -v python3)" \
      -DCMAKE_PREFIX_PATH="$d" -DOPENSSL_ROOT_DIR="$d" && cmake --build /tmp/hkv-py -j 16
    echo "build rc=$?"
  } > "$OUT/python_build.log" 2>&1
  (cd /work/main && PYTHONPATH=/tmp/hkv-py/python timeout 400 python3 -m pytest -v -p no:cacheprovider \
    python/tests -rs > "$OUT/python_tests.log" 2>&1
   echo "pytest rc=$?" >> "$OUT/python_tests.log")
}

# pymod, then hybridkv.hf's per-family report and example on CUDA.
hf() {
  pymod
  cd /work/main
  export PYTHONPATH=/tmp/hkv-py/python
  timeout 300 python3 bench/hf_report.py --device cuda > "$OUT/hf_report.md" 2>&1
  echo "rc=$?" >> "$OUT/hf_report.md"
  for f in nemotron_h qwen3_next falcon_h1 jamba gemma3_text; do
    echo "== $f"; timeout 100 python3 examples/hf_prefix_reuse.py --family "$f" --device cuda
  done > "$OUT/hf_example.txt" 2>&1
}

# Snapshot precision (fp8 kernels): the GPU suite, memcheck over the backend test, then hf.
precision() {
  suite_tests
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/cuda_backend_test" \
    > "$OUT/sanitizer.log" 2>&1
  echo "memcheck rc=$?" >> "$OUT/summary.txt"
  hf
}

# After a rebalancer change: the GPU suite, racecheck and memcheck over the suites that move pages
# (racecheck of eviction_order_test takes about 250 s on the H200)
# and resize pools, and a verified sim of the slice's first requests on the cuda backend.
racecheck() {
  suite_tests
  for run in "racecheck cuda_backend_test" "racecheck snapshot_precision_test" \
             "racecheck eviction_order_test" "memcheck eviction_order_test" \
             "racecheck kv_cache_test --gtest_filter=*Suspend*:*Resume*:*Copy*" \
             "racecheck disk_tier_test"; do
    set -- $run
    tool=$1; shift
    echo "=== compute-sanitizer --tool $tool $*"
    (cd /work/main && TMPDIR=/var/tmp timeout 300 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$B/$@" 2>&1 | grep -E "PASSED|FAILED|SUMMARY|ERROR|rror" | tail -6
     echo "rc=${PIPESTATUS[0]}")
  done > "$OUT/sanitizer.log" 2>&1
  (cd /work/main && timeout 150 "$B/hybridkv" sim --model models/nemotron_h_8b.json \
    --trace data/mooncake_conversation_first1000.jsonl --limit 200 --backend cuda --verify \
    --tp 8 --gpu-quota 512MiB --host-quota 1GiB --max-batch 16 --snapshot-dtype fp8 --quiet \
    > "$OUT/example.txt" 2>&1; echo "sim rc=$?" >> "$OUT/example.txt")
}

# After the kept-copies change: the GPU suite (the randomized reuse test checks tree pages'
# digests across evictions back to kept copies), racecheck over a verified sim whose evictions go
# back to copies, and the demo's settings on the cuda backend with and without copies.
copies() {
  suite_tests
  local sim=("$B/hybridkv" sim --model models/nemotron_h_8b.json
             --trace data/mooncake_conversation_first1000.jsonl --tp 8 --max-batch 16)
  (cd /work/main
   timeout 200 "${sim[@]}" --limit 300 --backend cuda --verify --gpu-quota 256MiB \
     --host-quota 2GiB --quiet > "$OUT/copies_verify_cuda.txt" 2>&1
   echo "sim rc=$?" >> "$OUT/copies_verify_cuda.txt"
   timeout 250 compute-sanitizer --tool racecheck --error-exitcode 9 "${sim[@]}" --limit 40 \
     --backend cuda --verify --gpu-quota 256MiB --host-quota 2GiB --quiet 2>&1 \
     | grep -E "SUMMARY|ERROR|rror|verify|tier moves|went back" | tail -8 >> "$OUT/copies_verify_cuda.txt"
   echo "racecheck rc=${PIPESTATUS[0]}" >> "$OUT/copies_verify_cuda.txt"
   for c in keep drop; do
     for h in 4GiB 16GiB; do
       echo "=== demo settings, host $h, --colder-copies $c"
       timeout 100 "${sim[@]}" --backend cuda --gpu-quota 2GiB --host-quota $h --colder-copies $c \
         --quiet 2>&1 | grep -E "reused tokens|tier moves|went back|wall time"
     done
   done > "$OUT/demo_cuda_copies.txt" 2>&1)
}

all() {
  suite
  bench
}

"$1"
