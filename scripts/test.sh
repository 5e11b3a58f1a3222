#!/usr/bin/env bash
# Every test: the format check, the normal build (library, CLI, Python module), the C++ and Python
# tests, `pip install .` of the Python package, and the AddressSanitizer + UBSan build.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
phase_start=$SECONDS
phases=""
# Each phase's wall time, printed at the end (where CI's 30 minutes go).
phase() {
  phases+="$(printf '%5d s  %s' $((SECONDS - phase_start)) "$current")"$'\n'
  phase_start=$SECONDS
  current=$1
  echo "== $1"
}
current="deps (Debian packages, the Python venv)"
bash scripts/deps.sh
jobs=$(nproc)

phase "format check"
git ls-files '*.h' '*.cc' | xargs clang-format --dry-run --Werror

phase "release build (build/release: library, CLI, Python module, tests, benchmarks)"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHYBRIDKV_PYTHON=ON \
  -DPython_EXECUTABLE="$PWD/build/venv/bin/python" >/dev/null
cmake --build build/release -j "$jobs"
phase "release CTest"
ctest --test-dir build/release --output-on-failure -j "$jobs"

phase "Python tests (pytest, the module from build/release)"
PYTHONPATH=build/release/python build/venv/bin/python -m pytest -q python/tests

# After pytest, not beside it: beside it the two shared the two cores and took as long together
# (239 s against 98 + 137 s one after the other).
phase "pip install . (scikit-build-core builds the package; then it is imported from outside)"
build/venv/bin/pip install -q --no-build-isolation --no-deps . >/tmp/hybridkv-pip-install.log 2>&1 ||
  { cat /tmp/hybridkv-pip-install.log; exit 1; }
root=$PWD
(cd /tmp && "$root/build/venv/bin/python" -c \
  'import hybridkv, hybridkv.hf, sys; sys.exit(hybridkv.main(["plan", "--help"]) != 0)' >/dev/null)

phase "sanitizer build (build/asan: Debug with ASan + UBSan; invariants checked after every mutation)"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHYBRIDKV_SANITIZE=ON \
  -DHYBRIDKV_BENCH=OFF -DHYBRIDKV_CUDA=OFF >/dev/null
cmake --build build/asan -j "$jobs"
phase "sanitizer CTest"
# The randomized schedules' twins on memory the engine owns are left to the release CTest (each
# took 40-140 s here for what the host-backend runs and the other engine twins already cover).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j "$jobs" \
  -E '^(randomized_reuse_test|randomized_test)_engine$'

phase "ThreadSanitizer build and suites (copy engine and concurrency tests)"
cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHYBRIDKV_TSAN=ON \
  -DHYBRIDKV_BENCH=OFF -DHYBRIDKV_CUDA=OFF >/dev/null
cmake --build build/tsan -j "$jobs" --target kv_cache_test reuse_test storage_test \
  shared_tier_test shared_memory_test agreement_test
tsan() {
  local test=$1
  shift
  TSAN_OPTIONS=halt_on_error=1 "build/tsan/tests/$test" "$@"
}
tsan kv_cache_test --gtest_filter='Lifecycle.NothingReads*:Lifecycle.Concurrent*:Lifecycle.SuspendedPages*'
tsan reuse_test --gtest_filter='Reuse.ProbesRun*:Reuse.TreePages*'
tsan storage_test --gtest_filter='StorageHostBackend.*'
# The shared tier's writer thread, and a fetch on a worker thread beside serving.
tsan shared_tier_test \
  --gtest_filter='SharedTierTest.AFetchOnAWorkerThread*:SharedTierTest.AnotherInstance*:SharedTierTest.ADeadStore*'
# Publishing copies on the copy thread, async fetches on the tier's fetcher thread.
tsan shared_memory_test
# Two ranks' managers in two threads, their copy threads skewed.
tsan agreement_test
phase "done"
echo "== wall time by phase"
printf '%s' "$phases"
echo "$((SECONDS - start)) s in all"
