#!/usr/bin/env bash
# Every test: installs dependencies, builds (CUDA backend compiled when nvcc
# exists; GPU tests skip without a device), runs the C++/C suites, the C API
# test under valgrind, the bindings' suites, the whole C++ suite again under
# AddressSanitizer + UBSan, the concurrency tests and the randomized stress test
# under ThreadSanitizer and a bounded snapshot fuzzer run.
# Fails on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export SSA_WITH_BINDINGS=1 SSA_WITH_FUZZ=1
bash scripts/install_deps.sh
jobs=$(nproc)

echo "== build and test (release with debug info)"
cmake -S . -B build >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure

echo "== C API test under valgrind (memcheck, leaks)"
# Against the uninstrumented shared library as users load it. Any invalid
# access, uninitialised read or definite/possible leak makes valgrind exit 1.
valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,possible \
  ./build/tests/ssa_c_api_test

if [ -x bindings/test_all.sh ]; then
  echo "== bindings (Python, Rust, Go)"
  bash bindings/test_all.sh build
fi

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -DSSA_SANITIZE=ON -DSSA_ENABLE_CUDA=OFF -DSSA_BUILD_BENCH=OFF \
  -DSSA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure
echo "== ThreadSanitizer: concurrent decodes beside writers; randomized multi-session stress"
cmake -S . -B build-tsan -DSSA_TSAN=ON -DSSA_ENABLE_CUDA=OFF -DSSA_BUILD_BENCH=OFF \
  -DSSA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-tsan -j"$jobs" --target ssa_tests
# The stress test prints its operation counts; SSA_STRESS_SECONDS bounds it.
SSA_STRESS_SECONDS="${SSA_STRESS_SECONDS:-20}" TSAN_OPTIONS=halt_on_error=1 \
  ./build-tsan/tests/ssa_tests -tc="*committed*,stress:*"
echo "== snapshot loader fuzzer (bounded: 60 s)"
bash fuzz/run_fuzzer.sh 60 "$jobs"
echo "== all tests passed"
