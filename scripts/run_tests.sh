#!/usr/bin/env bash
# Every test: installs dependencies, builds (CUDA backend compiled when nvcc
# exists; GPU tests report skipped without a device), runs the C++/C suites, the
# C API tests under valgrind, the bindings' suites, the Python package as users
# install it with the transformers integration (ssa.hf on SmolLM2), the wheel in a
# fresh venv without Abseil, xxHash or a compiler, the whole C++ suite again
# under AddressSanitizer + UBSan, the concurrency tests and the randomized stress
# test under ThreadSanitizer and a bounded snapshot fuzzer run.
# Fails on the first failure and prints how long each stage took.
#
# Each build folder is configured with every option the stage relies on, so a
# folder configured otherwise before (scripts/run_example.sh, a developer's
# cmake call) is brought back to what the tests need.
# SSA_TEST_STAGES=build,ctest,valgrind,bindings,hf,wheel,asan,tsan,fuzz (default: all)
# runs only the named stages ("ctest", "valgrind" and "bindings" need "build"'s
# folder to exist).
set -euo pipefail
cd "$(dirname "$0")/.."
export SSA_WITH_BINDINGS=1 SSA_WITH_FUZZ=1
jobs=$(nproc)
stages="${SSA_TEST_STAGES:-build,ctest,valgrind,bindings,hf,wheel,asan,tsan,fuzz}"
want() { case ",$stages," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

declare -a timings=()
stage_name="" stage_start=0
begin() { stage_name="$1"; stage_start=$SECONDS; echo "== $1"; }
end() {
  timings+=("$(printf '%-10s %5d s' "$stage_name" $((SECONDS - stage_start)))")
  echo "-- $stage_name: $((SECONDS - stage_start)) s"
}
report() {
  echo "== stage durations"
  local t
  for t in "${timings[@]}"; do echo "   $t"; done
}
trap report EXIT

begin deps
bash scripts/install_deps.sh
end

# Options every configuration states, whatever the folder held before. Debug
# information is line tables only (-g1): what stack traces from valgrind and the
# sanitizers name (function, file, line), in less compile time than full -g; the
# code generated is the same.
common=(-DSSA_BUILD_SHARED=ON -DSSA_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")

if want build; then
  begin build
  cmake -S . -B build "${common[@]}" -DSSA_BUILD_BENCH=ON -DSSA_BUILD_EXAMPLES=ON \
    -DSSA_ENABLE_CUDA=ON -DSSA_SANITIZE=OFF -DSSA_TSAN=OFF >/dev/null
  cmake --build build -j"$jobs"
  end
fi

if want ctest; then
  begin ctest
  ctest --test-dir build --output-on-failure --no-tests=error -j"$jobs"
  end
fi

if want valgrind; then
  begin valgrind
  # Against the uninstrumented shared library as users load it. Any invalid
  # access, uninitialised read or definite/possible leak makes valgrind exit 1.
  for t in ssa_c_api_test ssa_c_struct_rules_test; do
    valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,possible \
      "./build/tests/$t"
  done
  end
fi

if want bindings && [ -x bindings/test_all.sh ]; then
  begin bindings
  bash bindings/test_all.sh build
  end
fi

if want hf; then
  begin hf
  # pip install ./bindings/python (it builds libssa), torch and transformers once,
  # then the binding's suite and the ssa.hf suite (tiny random models, SmolLM2).
  bash bindings/python/ci_test.sh
  end
fi

if want wheel; then
  begin wheel
  # The CPU wheel (libssa, Abseil and xxHash inside) installed from local files in
  # a fresh venv with Abseil, xxHash and the compilers hidden; the binding's suite
  # run from it; the one-line refusal of a source install without Abseil.
  bash bindings/python/wheel_test.sh
  end
fi

if want asan; then
  begin asan
  cmake -S . -B build-asan "${common[@]}" -DSSA_SANITIZE=ON -DSSA_TSAN=OFF -DSSA_ENABLE_CUDA=OFF \
    -DSSA_BUILD_BENCH=OFF -DSSA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  # The boundary sweep's every shape ran in "ctest"; here one shape per dtype.
  SSA_SWEEP_DIAGONAL=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure --no-tests=error -j"$jobs"
  end
fi

if want tsan; then
  begin tsan
  # Concurrent decodes beside writers; randomized multi-session stress: the
  # program of these two only (ssa_thread_tests), at -O1 (ThreadSanitizer's
  # advice; half the compile time of -O2).
  cmake -S . -B build-tsan "${common[@]}" -DSSA_TSAN=ON -DSSA_SANITIZE=OFF -DSSA_ENABLE_CUDA=OFF \
    -DSSA_BUILD_BENCH=OFF -DSSA_BUILD_EXAMPLES=OFF \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" >/dev/null
  cmake --build build-tsan -j"$jobs" --target ssa_thread_tests
  # The stress test prints its operation counts; SSA_STRESS_SECONDS bounds it.
  SSA_STRESS_SECONDS="${SSA_STRESS_SECONDS:-20}" TSAN_OPTIONS=halt_on_error=1 ./build-tsan/tests/ssa_thread_tests
  end
fi

if want fuzz; then
  begin fuzz
  echo "snapshot loader fuzzer (bounded: 60 s)"
  bash fuzz/run_fuzzer.sh 60 "$jobs"
  end
fi
echo "== all tests passed"
