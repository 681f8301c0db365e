#!/usr/bin/env bash
# Side-by-side GPU measurement of the working tree against a base revision, in
# one call: builds both, runs the GPU tests on the working tree, then the same
# benchmark slice alternately (base, new, base, new) and the ncu kernel times of
# one 1M-token decode of each. SSA_AB_PATCHES (space-separated patch files) adds
# one variant per patch: the working tree with it applied (patch -p1), measured
# in the same rounds and named after the file.
#   git archive BASE | (mkdir -p .base && tar -x -C .base)   # here, once per base
#   SSA_DEBS=.debs SSA_BASE=.base [SSA_AB_PATCHES="x.patch y.patch"] bash scripts/gpu_ab.sh [gpu_decode_bench arguments]
# Logs go to $OUT (default ./gpu_out): quality.txt (the working tree's quality-test
# errors), ab_bench.log, ab_table.md (per case, each variant's best round and its
# ratio to the base), ncu_<variant>.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
export OUT
BASE_SRC=${SSA_BASE:-.base}
[ -f "$BASE_SRC/CMakeLists.txt" ] || { echo "no base tree in $BASE_SRC"; exit 1; }
SSA_GPU_STAGES=build,test bash scripts/gpu_check.sh || exit 1
. "$(dirname "$0")/gpu_prefix.sh"
ssa_prefix_libs
# The working tree's fidelity: the GPU quality test's mean errors, which print the
# same numbers when no selection, draw or weight changed (bench/RESULTS.md).
echo "### quality (working tree)"
build-gpu/tests/gpu/ssa_gpu_tests -tc="gpu SSA error distribution*" -s 2>&1 | grep -i "mean error" |
  tee "$OUT/quality.txt"
export CMAKE_PREFIX_PATH=$SSA_PREFIX/usr
# build_bench NAME SOURCE_DIR: configures and builds gpu_decode_bench in /tmp/ssa-NAME-build.
build_bench() {
  local t0 dir=/tmp/ssa-$1-build
  t0=$(date +%s)
  cmake -S "$2" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$OUT/$1_configure.log" 2>&1 || { tail -30 "$OUT/$1_configure.log"; exit 1; }
  cmake --build "$dir" -j "$(nproc)" --target gpu_decode_bench >"$OUT/$1_build.log" 2>&1 ||
    { grep -E "error" -A3 "$OUT/$1_build.log" | head -40; exit 1; }
  echo "== $1 built in $(( $(date +%s) - t0 )) s"
}
build_bench base "$BASE_SRC"
declare -A BIN=([base]=/tmp/ssa-base-build/bench/gpu_decode_bench [new]=build-gpu/bench/gpu_decode_bench)
VARIANTS=(base new)
for PATCH in ${SSA_AB_PATCHES:-}; do
  name=$(basename "$PATCH" .patch)
  PATCH=$(cd "$(dirname "$PATCH")" && pwd)/$(basename "$PATCH")
  rm -rf "/tmp/ssa-$name-src" && mkdir -p "/tmp/ssa-$name-src"
  tar -c --exclude='./build*' --exclude='./.base' --exclude='./.flashinfer' . | tar -x -C "/tmp/ssa-$name-src"
  (cd "/tmp/ssa-$name-src" && patch -p1 <"$PATCH") || exit 1
  build_bench "$name" "/tmp/ssa-$name-src"
  BIN[$name]=/tmp/ssa-$name-build/bench/gpu_decode_bench
  VARIANTS+=("$name")
done
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--configs paper,llama8b --contexts 128K,1M --batches 1,16 --sparsity 50 --seeds 1 --methods ssa)
for round in 1 2; do
  for v in "${VARIANTS[@]}"; do
    echo "### $v round $round" | tee -a "$OUT/ab_bench.log"
    "${BIN[$v]}" "${ARGS[@]}" 2>&1 | grep -v '^{' | grep -v '^# \(case\|setup\|copy\)' | tee -a "$OUT/ab_bench.log"
  done
done
echo "### best of the rounds per case (scripts/ab_compare.py)"
python3 scripts/ab_compare.py "$OUT/ab_bench.log" | tee "$OUT/ab_table.md"
for v in "${VARIANTS[@]}"; do
  echo "### ncu kernel times, $v"
  bash scripts/ncu_kernel_times.sh "${BIN[$v]}" "$OUT/ncu_$v.log" | grep -v "fill_\|encode_kernel" |
    tee "$OUT/ncu_$v.txt"
done
