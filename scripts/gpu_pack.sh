#!/usr/bin/env bash
# Builds (Release, CUDA on) and strips what scripts/gpu_session.sh runs on the GPU machine into
# gpu_bin/ (ignored by git; the device tool carries it).
set -eu
cd "$(dirname "$0")/.."
grep -qx '/gpu_bin/' .git/info/exclude || echo '/gpu_bin/' >> .git/info/exclude
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYBRIDKV_PYTHON=OFF > /dev/null
targets="hybridkv_cli gpu_requests cuda_copy_bench disk_tier_bench cuda_backend_test kv_cache_test
  randomized_test reuse_test randomized_reuse_test hybrid_test commit_test engine_calls_test
  eviction_order_test snapshot_precision_test disk_tier_test"
cmake --build build/gpu --target $targets
rm -rf gpu_bin && mkdir gpu_bin
for t in $targets; do
  f=$(find build/gpu -maxdepth 2 -type f -name "${t/hybridkv_cli/hybridkv}" -perm -u+x | head -1)
  strip -o "gpu_bin/$(basename "$f")" "$f"
done
cp ../shared/tools/gpu_copy_limits.cu gpu_bin/
# What the GPU machine's image lacks to build the Python module there (its Python differs from
# ours): the header-only JSON and CLI libraries with their CMake packages, OpenSSL's headers and
# libcrypto.
d=gpu_bin/deps
mkdir -p $d/include $d/share/cmake $d/lib
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/openssl $d/include/
cp /usr/include/x86_64-linux-gnu/openssl/*.h $d/include/openssl/
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 $d/share/cmake/
cp /usr/lib/x86_64-linux-gnu/libcrypto.so.3 $d/lib/ && ln -sf libcrypto.so.3 $d/lib/libcrypto.so
du -sh gpu_bin
