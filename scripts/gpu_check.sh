#!/usr/bin/env bash
# Builds libssa with the CUDA backend on a machine with an NVIDIA GPU, runs the
# GPU tests (ctest label "gpu"), compute-sanitizer memcheck and racecheck on a
# small case (SSA_SANITIZE_TOOLS and SSA_SANITIZE_TESTS pick others) and the GPU
# decode benchmark matrix (report in $OUT/bench.md); on request (stage "python",
# wheels from $SSA_WHEELS) the Python binding's CUDA tests. Logs go to $OUT
# (default ./gpu_out).
# Abseil, xxHash and doctest may come as .deb files in $SSA_DEBS (default
# ../.debs); they are unpacked under /tmp/prefix (scripts/gpu_prefix.sh), never
# into /. FlashInfer's headers in $SSA_FLASHINFER (default .flashinfer) add it as
# a dense baseline.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
DEBS=${SSA_DEBS:-../.debs}
. "$(dirname "$0")/gpu_prefix.sh"
PREFIX=$SSA_PREFIX
if [ -d "$DEBS" ]; then
  mkdir -p "$PREFIX"
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX"; done
  export CMAKE_PREFIX_PATH=$PREFIX/usr
  export PKG_CONFIG_PATH=$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig:$PREFIX/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  ssa_prefix_libs
fi
STAGE=${SSA_GPU_STAGES:-build,test,sanitize,bench}
has() { [[ ",$STAGE," == *",$1,"* ]]; }
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi -L | tee "$OUT/summary.txt"
BUILD=${SSA_GPU_BUILD:-build-gpu}
if has build; then
  log "configure + build"
  t0=$(date +%s)
  # FlashInfer's headers (scripts/fetch_flashinfer_headers.sh), when present, add
  # its batch decode to the benchmark as a dense baseline.
  FI=${SSA_FLASHINFER:-.flashinfer}
  FI_ARG=()
  [ -f "$FI/VERSION" ] && FI_ARG=(-DSSA_FLASHINFER_DIR="$(cd "$FI" && pwd)")
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSSA_BUILD_EXAMPLES=ON "${FI_ARG[@]}" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
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
  for tool in ${SSA_SANITIZE_TOOLS:-memcheck racecheck}; do
    log "compute-sanitizer $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$TESTS" -tc="${SSA_SANITIZE_TESTS:-gpu small end-to-end*,gpu snapshots*}" \
      >"$OUT/sanitizer_$tool.log" 2>&1 || rc=1
    tail -4 "$OUT/sanitizer_$tool.log" | tee -a "$OUT/summary.txt"
  done
fi
if has python; then
  # The Python binding's CUDA path (bindings/python/tests/test_cuda.py, torch
  # tensors on the device). Its wheels come from $SSA_WHEELS (default .whl, filled
  # where PyPI is reachable with: pip download --only-binary=:all: --python-version
  # 3.12 --platform manylinux2014_x86_64 -d .whl cffi pytest 'setuptools<82' scikit-build-core) into a
  # folder under /tmp, never into the system.
  log "python binding on the GPU"
  PYDEPS=/tmp/ssa_pydeps
  LIB_DIR=$(cd "$BUILD" && pwd)
  {
    python3 -m pip install -q --no-index --find-links "${SSA_WHEELS:-.whl}" --target "$PYDEPS" cffi pytest setuptools scikit-build-core &&
      PYTHONPATH="$PYDEPS" SSA_LIB_DIR="$LIB_DIR" SSA_INCLUDE_DIR="$PWD/include" \
        python3 -m pip install -q --no-build-isolation --no-deps --target "$PYDEPS" ./bindings/python &&
      (root=$PWD && cd / && PYTHONPATH="$PYDEPS" python3 -m pytest -q -p no:cacheprovider -rs "$root/bindings/python/tests/test_cuda.py")
  } >"$OUT/python.log" 2>&1 || rc=1
  # A skip (no torch, no device) would pass pytest; here it is a failure.
  if grep -q "skipped" "$OUT/python.log"; then echo "python: CUDA tests skipped" >>"$OUT/python.log"; rc=1; fi
  tail -5 "$OUT/python.log" | tee -a "$OUT/summary.txt"
fi
if has bench && [ -x "$BUILD/bench/gpu_decode_bench" ]; then
  # The benchmark matrix: ours (bench/gpu_decode_bench.cu), then PyTorch SDPA in a
  # separate process (device memory is not shared), then the markdown report.
  # Both print JSON lines (kept in the raw log) and '#' progress notes (shown
  # here). bench.md ends with the raw lines, so the raw log is removed once the
  # report is written.
  log "benchmark matrix"
  t0=$(date +%s)
  RAW="$OUT/bench_raw.log"
  echo "{\"rec\":\"meta\",\"src\":\"git\",\"commit\":\"${SSA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}\"}" >"$RAW"
  # SSA_BENCH_ARGS: extra gpu_decode_bench arguments (e.g. --seeds 2 --time-budget-s 200).
  "$BUILD/bench/gpu_decode_bench" ${SSA_BENCH_ARGS:-} 2>&1 | tee -a "$RAW" | grep --line-buffered -v '^{'
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  # FlashInfer (when built in) in a process of its own: a fault there cannot take
  # the other results with it.
  if grep -q "^SSA_FLASHINFER_DIR:PATH=." "$BUILD/CMakeCache.txt" 2>/dev/null; then
    "$BUILD/bench/gpu_decode_bench" ${SSA_BENCH_ARGS:-} --methods flashinfer 2>&1 | tee -a "$RAW" | grep --line-buffered -v '^{'
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  fi
  if [ -f bench/gpu_sdpa_bench.py ]; then
    PYTHONUNBUFFERED=1 python3 bench/gpu_sdpa_bench.py 2>&1 | tee -a "$RAW" | grep --line-buffered -v '^{'
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  fi
  if python3 bench/gpu_bench_report.py "$RAW" --raw --out "$OUT/bench.md"; then
    rm -f "$RAW"
    sed -n '/^## Targets/,/^## Cases/p' "$OUT/bench.md" | grep -v '^## Cases' | tee -a "$OUT/summary.txt"
  else
    rc=1
  fi
  log "benchmark matrix took $(( $(date +%s) - t0 )) s"
fi
if has profile && command -v ncu >/dev/null; then
  log "ncu kernel times of one 1M-token SSA decode and one dense decode"
  SSA_BENCH_PROFILE=1 ncu --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    "$BUILD/bench/gpu_decode_bench" >"$OUT/ncu.log" 2>&1 || rc=1
  grep -E "^  [a-z_]+.*\(|gpu__time|dram__|warps_active" "$OUT/ncu.log" | head -150 > "$OUT/ncu_summary.log"
fi
log "exit $rc"
exit $rc
