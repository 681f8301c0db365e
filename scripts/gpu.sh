#!/usr/bin/env bash
# The GPU driver: everything run on a machine with an NVIDIA GPU, one subcommand
# per purpose, all starting from the same build (build-gpu, or $SSA_GPU_BUILD).
#
#   bash scripts/gpu.sh check                 stages in SSA_GPU_STAGES (default
#                                             build,test,sanitize,bench; also python, profile)
#   bash scripts/gpu.sh quick [BENCH ARGS]    build, GPU tests, a slice of the matrix, kernel times
#   bash scripts/gpu.sh ab [BENCH ARGS]       the working tree against the tree in $SSA_BASE
#   bash scripts/gpu.sh split-sweep           attention split counts, one benchmark run each
#
# BENCH ARGS are gpu_decode_bench arguments (--configs, --contexts, --batches,
# --sparsity, --methods, --seeds, ...). Logs go to $OUT (default ./gpu_out).
#
# Stages of `check`: build (CMake + Ninja, Release, sm_90; FlashInfer's headers in
# $SSA_FLASHINFER, default .flashinfer, add it as a dense baseline); test (ctest
# label "gpu"); sanitize (compute-sanitizer tools $SSA_SANITIZE_TOOLS, default
# memcheck racecheck, on the tests $SSA_SANITIZE_TESTS); bench (the decode matrix:
# ours, FlashInfer, PyTorch SDPA, then $OUT/bench.md by bench/gpu_bench_report.py;
# $SSA_BENCH_ARGS are passed to gpu_decode_bench); python (the Python binding's
# CUDA tests, wheels from $SSA_WHEELS); profile (ncu kernel times, scripts/ncu.sh).
#
# `ab`: build both trees, the GPU tests and the quality test's errors on the
# working tree, then the benchmark slice alternately (base, new, base, new),
# the best round per case and its ratio (scripts/ab_compare.py) and ncu kernel
# times of each. Make the base tree once per base revision:
#   git archive BASE | (mkdir -p .base && tar -x -C .base)
# SSA_AB_PATCHES="a.patch b.patch" adds one variant per patch (the working tree
# with it applied), measured in the same rounds.
#
# Abseil, xxHash and doctest may come as .deb files in $SSA_DEBS (default
# ../.debs); they are unpacked under /tmp/prefix, never into /.
# Functions run through "stage_$s" and "cmd_$cmd" (shellcheck cannot see those calls);
# benchmark arguments are comma lists.
# shellcheck disable=SC2317,SC2054
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu_out}
export OUT
BUILD=${SSA_GPU_BUILD:-build-gpu}
BENCH="$BUILD/bench/gpu_decode_bench"
PREFIX=/tmp/prefix
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# The .deb dependencies unpacked under $PREFIX (when given), and the paths that
# find them; programs built against them find their libraries either way.
use_prefix() {
  local debs=${SSA_DEBS:-../.debs} f
  if [ -d "$debs" ]; then
    mkdir -p "$PREFIX"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$PREFIX"; done
    export CMAKE_PREFIX_PATH=$PREFIX/usr
    export PKG_CONFIG_PATH=$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig:$PREFIX/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  fi
  export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
}

# quick, ab: no measurement of a tree whose GPU tests fail.
stop_on_failure() { [ "$rc" -eq 0 ] || { log "exit $rc"; exit "$rc"; }; }

# configure_build NAME SOURCE_DIR BUILD_DIR [cmake --build arguments]
configure_build() {
  local name=$1 src=$2 dir=$3 t0 fi_arg=()
  shift 3
  t0=$(date +%s)
  local fi=${SSA_FLASHINFER:-.flashinfer}
  [ -f "$fi/VERSION" ] && fi_arg=(-DSSA_FLASHINFER_DIR="$(cd "$fi" && pwd)")
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSSA_BUILD_EXAMPLES=ON "${fi_arg[@]}" >"$OUT/${name}_configure.log" 2>&1 ||
    { tail -30 "$OUT/${name}_configure.log"; exit 1; }
  cmake --build "$dir" -j "$(nproc)" "$@" >"$OUT/${name}_build.log" 2>&1 ||
    { grep -E "error" -A3 "$OUT/${name}_build.log" | head -60; exit 1; }
  log "$name built in $(( $(date +%s) - t0 )) s"
}

stage_build() { configure_build build . "$BUILD"; }

stage_test() {
  local tests="$BUILD/tests/gpu/ssa_gpu_tests"
  log "gpu tests"
  (cd "$BUILD" && ctest -L gpu --no-tests=error --output-on-failure) >"$OUT/tests.log" 2>&1 || rc=1
  tail -25 "$OUT/tests.log"
  "$tests" >"$OUT/tests_direct.log" 2>&1 || rc=1
  grep -E "test cases|assertions" "$OUT/tests_direct.log" | tee -a "$OUT/summary.txt"
}

stage_sanitize() {
  local tool
  for tool in ${SSA_SANITIZE_TOOLS:-memcheck racecheck}; do
    log "compute-sanitizer $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$BUILD/tests/gpu/ssa_gpu_tests" \
      -tc="${SSA_SANITIZE_TESTS:-gpu small end-to-end*,gpu snapshots*}" >"$OUT/sanitizer_$tool.log" 2>&1 || rc=1
    tail -4 "$OUT/sanitizer_$tool.log" | tee -a "$OUT/summary.txt"
  done
}

# The Python binding's CUDA path (bindings/python/tests/test_cuda.py, torch
# tensors on the device; test_hf_cuda.py, ssa.hf on a random model of
# Llama-3.1-8B's attention shape against transformers' sdpa), then the
# end-to-end decode through generate (bench/hf_decode_bench.py, $SSA_HF_BENCH_ARGS;
# skipped when SSA_HF_BENCH=0). The machine's python3 has torch, transformers,
# pytest and scikit-build-core; cffi and pycparser come as wheels from $SSA_WHEELS
# (default .whl; fill it where PyPI is reachable: pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl
# cffi pycparser), installed into a folder under /tmp, never into the system.
stage_python() {
  local deps=/tmp/ssa_pydeps lib_dir root=$PWD
  lib_dir=$(cd "$BUILD" && pwd)
  log "python binding on the GPU"
  {
    { python3 -c "import cffi" 2>/dev/null ||
      python3 -m pip install -q --no-index --no-deps --find-links "${SSA_WHEELS:-.whl}" --target "$deps" cffi pycparser; } &&
      PYTHONPATH="$deps" SSA_LIB_DIR="$lib_dir" SSA_INCLUDE_DIR="$root/include" \
        python3 -m pip install -q --no-build-isolation --no-deps --target "$deps" ./bindings/python &&
      (cd / && PYTHONPATH="$deps" python3 -m pytest -q -s -p no:cacheprovider -rs -W ignore::FutureWarning \
        "$root/bindings/python/tests/test_cuda.py" "$root/bindings/python/tests/test_hf_cuda.py")
  } >"$OUT/python.log" 2>&1 || rc=1
  # A skip (no torch, no device) would pass pytest; here it is a failure.
  if grep -q "skipped" "$OUT/python.log"; then echo "python: CUDA tests skipped" >>"$OUT/python.log"; rc=1; fi
  tail -8 "$OUT/python.log" | tee -a "$OUT/summary.txt"
  if [ "${SSA_HF_BENCH:-1}" != 0 ]; then
    log "ssa.hf decode through generate (bench/hf_decode_bench.py)"
    # shellcheck disable=SC2086
    (cd / && PYTHONPATH="$deps" python3 "$root/bench/hf_decode_bench.py" ${SSA_HF_BENCH_ARGS:-} \
      --json "$OUT/hf_decode_bench.json") 2>&1 | tee "$OUT/hf_decode_bench.md" || rc=1
  fi
}

# run_logged RAW CMD...: appends the JSON lines to RAW, shows the '#' notes.
run_logged() {
  local raw=$1
  shift
  "$@" 2>&1 | tee -a "$raw" | grep --line-buffered -v '^{'
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
}

# The matrix: ours, FlashInfer (when built in; a process of its own, so that a
# fault there cannot take the other results with it), PyTorch SDPA (another
# process: device memory is not shared), then the report. bench.md ends with the
# raw lines, so the raw log goes once the report is written.
stage_bench() {
  [ -x "$BENCH" ] || { log "no $BENCH"; rc=1; return; }
  local t0 raw="$OUT/bench_raw.log"
  log "benchmark matrix"
  t0=$(date +%s)
  echo "{\"rec\":\"meta\",\"src\":\"git\",\"commit\":\"${SSA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}\"}" >"$raw"
  # shellcheck disable=SC2086  # SSA_BENCH_ARGS is a list of arguments
  run_logged "$raw" "$BENCH" ${SSA_BENCH_ARGS:-}
  if grep -q "^SSA_FLASHINFER_DIR:PATH=." "$BUILD/CMakeCache.txt" 2>/dev/null; then
    # shellcheck disable=SC2086
    run_logged "$raw" "$BENCH" ${SSA_BENCH_ARGS:-} --methods flashinfer
  fi
  [ -f bench/gpu_sdpa_bench.py ] && PYTHONUNBUFFERED=1 run_logged "$raw" python3 bench/gpu_sdpa_bench.py
  if python3 bench/gpu_bench_report.py "$raw" --raw --out "$OUT/bench.md"; then
    rm -f "$raw"
    sed -n '/^## Targets/,/^## Cases/p' "$OUT/bench.md" | grep -v '^## Cases' | tee -a "$OUT/summary.txt"
  else
    rc=1
  fi
  log "benchmark matrix took $(( $(date +%s) - t0 )) s"
}

stage_profile() {
  log "ncu kernel times of one 1M-token decode per method"
  bash "$HERE/ncu.sh" times "$OUT/ncu.log" >"$OUT/ncu_summary.log" || rc=1
}

cmd_check() {
  local stages=${SSA_GPU_STAGES:-build,test,sanitize,bench} s
  for s in build test sanitize python bench profile; do
    [[ ",$stages," == *",$s,"* ]] && "stage_$s"
  done
}

cmd_quick() {
  local args=("$@")
  [ ${#args[@]} -gt 0 ] || args=(--configs paper --contexts 128K,1M --batches 1,16 --sparsity 20,50 --seeds 1)
  stage_build
  stage_test
  stop_on_failure
  "$BENCH" "${args[@]}" 2>&1 | grep -v '^{' | tee "$OUT/bench_quick.log"
  bash "$HERE/ncu.sh" times "$OUT/ncu.log" | tee "$OUT/ncu_kernels.txt"
}

cmd_ab() {
  local base_src=${SSA_BASE:-.base} args=("$@") v name patch round
  [ -f "$base_src/CMakeLists.txt" ] || { echo "no base tree in $base_src"; exit 1; }
  [ ${#args[@]} -gt 0 ] || args=(--configs paper,llama8b --contexts 128K,1M --batches 1,16 --sparsity 50 --seeds 1 --methods ssa)
  stage_build
  stage_test
  stop_on_failure
  # The working tree's fidelity: the GPU quality test prints the same mean errors
  # when no selection, draw or weight changed.
  echo "### quality (working tree)"
  "$BUILD/tests/gpu/ssa_gpu_tests" -tc="gpu SSA error distribution*" -s 2>&1 | grep -i "mean error" |
    tee "$OUT/quality.txt"
  configure_build base "$base_src" /tmp/ssa-base-build --target gpu_decode_bench
  declare -A bin=([base]=/tmp/ssa-base-build/bench/gpu_decode_bench [new]=$BENCH)
  local variants=(base new)
  for patch in ${SSA_AB_PATCHES:-}; do
    name=$(basename "$patch" .patch)
    patch=$(cd "$(dirname "$patch")" && pwd)/$(basename "$patch")
    rm -rf "/tmp/ssa-$name-src" && mkdir -p "/tmp/ssa-$name-src"
    tar -c --exclude='./build*' --exclude='./.base' --exclude='./.flashinfer' . | tar -x -C "/tmp/ssa-$name-src"
    (cd "/tmp/ssa-$name-src" && patch -p1 <"$patch") || exit 1
    configure_build "$name" "/tmp/ssa-$name-src" "/tmp/ssa-$name-build" --target gpu_decode_bench
    bin[$name]=/tmp/ssa-$name-build/bench/gpu_decode_bench
    variants+=("$name")
  done
  for round in 1 2; do
    for v in "${variants[@]}"; do
      echo "### $v round $round" | tee -a "$OUT/ab_bench.log"
      "${bin[$v]}" "${args[@]}" 2>&1 | grep -v '^{' | grep -v '^# \(case\|setup\|copy\)' | tee -a "$OUT/ab_bench.log"
    done
  done
  echo "### best of the rounds per case (scripts/ab_compare.py)"
  python3 "$HERE/ab_compare.py" "$OUT/ab_bench.log" | tee "$OUT/ab_table.md"
  for v in "${variants[@]}"; do
    echo "### ncu kernel times, $v"
    SSA_BENCH="${bin[$v]}" bash "$HERE/ncu.sh" times "$OUT/ncu_$v.log" | grep -v "fill_\|encode_kernel" |
      tee "$OUT/ncu_$v.txt"
  done
}

# Our dense kernel at batch 16 and the sparse gather (SSA 50x) at batch 1, one
# run per split count, the automatic choice (0) first and last (a drift check).
# SSA_DENSE_SPLITS and SSA_SPARSE_SPLITS replace the lists.
cmd_split_sweep() {
  local sweep="$OUT/split_sweep.log" n
  stage_build
  : >"$sweep"
  for n in ${SSA_DENSE_SPLITS:-0 2 4 8 16 33 66 0}; do
    echo "### dense splits $n" | tee -a "$sweep"
    "$BENCH" --configs paper,llama8b --contexts 128K,1M --batches 16 --methods dense --seeds 1 \
      --dense-splits "$n" 2>&1 | grep ' ms, graph' | tee -a "$sweep"
  done
  for n in ${SSA_SPARSE_SPLITS:-0 8 16 24 33 48 66 0}; do
    echo "### sparse splits $n" | tee -a "$sweep"
    "$BENCH" --configs paper,llama8b --contexts 128K,1M --batches 1 --sparsity 50 --methods ssa --seeds 1 \
      --sparse-splits "$n" 2>&1 | grep ' ms, graph' | tee -a "$sweep"
  done
}

rc=0
cmd=${1:-}
shift || true
case "$cmd" in
  check | quick | ab | split-sweep) ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
mkdir -p "$OUT"
use_prefix
nvidia-smi -L | tee "$OUT/summary.txt"
"cmd_${cmd//-/_}" "$@"
log "exit $rc"
exit $rc
