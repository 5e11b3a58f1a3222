#!/usr/bin/env bash
# Packs into build-gpu-deps/ (ignored; the device tool carries it) what the GPU machine's image
# lacks to build everything there: the JSON, CLI11, OpenSSL, GoogleTest and Benchmark headers,
# their CMake packages and libraries, in the layout their CMake files expect
# (CMAKE_PREFIX_PATH=build-gpu-deps), and the GPU copy-limit probe of ../shared/tools. Run it
# here; scripts/gpu_test.sh uses it there.
set -eu
cd "$(dirname "$0")/.."
bash scripts/deps.sh
d=build-gpu-deps
rm -rf $d && mkdir -p $d/include $d/share/cmake $d/lib/x86_64-linux-gnu/cmake
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/openssl /usr/include/gtest \
  /usr/include/gmock /usr/include/benchmark $d/include/
cp /usr/include/x86_64-linux-gnu/openssl/*.h $d/include/openssl/
cp /usr/include/xxhash.h $d/include/  # header only (XXH_INLINE_ALL)
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 $d/share/cmake/
l=/usr/lib/x86_64-linux-gnu
cp -r $l/cmake/GTest $l/cmake/benchmark $d/lib/x86_64-linux-gnu/cmake/
cp $l/libgtest*.a $l/libgmock*.a $l/libbenchmark* $d/lib/x86_64-linux-gnu/
cp $l/libcrypto.so.3 $d/lib/x86_64-linux-gnu/ && ln -sf libcrypto.so.3 $d/lib/x86_64-linux-gnu/libcrypto.so
if [ -f ../shared/tools/gpu_copy_limits.cu ]; then cp ../shared/tools/gpu_copy_limits.cu $d/; fi
du -sh $d
