#!/usr/bin/env bash
# Builds libssa with the CUDA backend on a machine with an NVIDIA GPU, runs the
# GPU tests (ctest label "gpu"), compute-sanitizer memcheck and racecheck on a
# small case, and the GPU decode benchmark. Logs go to $OUT (default ./gpu_out).
# Abseil, xxHash and doctest may come as .deb files in $SSA_DEBS (default
# ../.debs); they are unpacked under /tmp/prefix, never into /.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
DEBS=${SSA_DEBS:-../.debs}
PREFIX=/tmp/prefix
if [ -d "$DEBS" ]; then
  mkdir -p "$PREFIX"
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX"; done
  export CMAKE_PREFIX_PATH=$PREFIX/usr
  export PKG_CONFIG_PATH=$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig:$PREFIX/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
STAGE=${SSA_GPU_STAGES:-build,test,sanitize,bench}
has() { [[ ",$STAGE," == *",$1,"* ]]; }
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi -L | tee "$OUT/summary.txt"
BUILD=${SSA_GPU_BUILD:-build-gpu}
if has build; then
  log "configure + build"
  t0=$(date +%s)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSSA_BUILD_EXAMPLES=ON >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
  log "built in $(( $(date +%s) - t0 )) s"
fi
TESTS="$BUILD/tests/gpu/ssa_gpu_tests"
rc=0
if has test; then
  log "gpu tests"
  (cd "$BUILD" && ctest -L gpu --output-on-failure) >"$OUT/tests.log" 2>&1 || rc=1
  tail -25 "$OUT/tests.log"
  "$TESTS" >"$OUT/tests_direct.log" 2>&1 || rc=1
  grep -E "test cases|assertions" "$OUT/tests_direct.log" | tee -a "$OUT/summary.txt"
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    log "compute-sanitizer $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$TESTS" -tc="gpu small end-to-end*,gpu snapshots*" \
      >"$OUT/sanitizer_$tool.log" 2>&1 || rc=1
    tail -4 "$OUT/sanitizer_$tool.log" | tee -a "$OUT/summary.txt"
  done
fi
if has bench && [ -x "$BUILD/bench/gpu_decode_bench" ]; then
  log "benchmark"
  "$BUILD/bench/gpu_decode_bench" | tee "$OUT/bench.md" || rc=1
  if [ -f bench/gpu_sdpa_bench.py ]; then
    PYTHONUNBUFFERED=1 python3 bench/gpu_sdpa_bench.py | tee -a "$OUT/bench.md" || rc=1
  fi
fi
if has profile && command -v ncu >/dev/null; then
  log "ncu kernel times of one 1M-token SSA decode and one dense decode"
  SSA_BENCH_PROFILE=1 ncu --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    "$BUILD/bench/gpu_decode_bench" >"$OUT/ncu.log" 2>&1 || rc=1
  grep -E "^  [a-z_]+.*\(|gpu__time|dram__|warps_active" "$OUT/ncu.log" | head -150 > "$OUT/ncu_summary.log"
fi
log "exit $rc"
exit $rc
