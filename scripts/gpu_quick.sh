#!/usr/bin/env bash
# One GPU experiment in one call: build (incremental), the GPU tests, a small
# slice of the benchmark matrix and per-kernel times of one 1M-token decode.
#   SSA_DEBS=.debs bash scripts/gpu_quick.sh [gpu_decode_bench arguments]
# Logs go to $OUT (default ./gpu_out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
export OUT
SSA_GPU_STAGES=build,test bash scripts/gpu_check.sh || exit 1
. "$(dirname "$0")/gpu_prefix.sh"
ssa_prefix_libs
BENCH=build-gpu/bench/gpu_decode_bench
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--configs paper --contexts 128K,1M --batches 1,16 --sparsity 20,50 --seeds 1)
"$BENCH" "${ARGS[@]}" 2>&1 | grep -v '^{' | tee "$OUT/bench_quick.log"
bash scripts/ncu_kernel_times.sh "$BENCH" "$OUT/ncu.log" | tee "$OUT/ncu_kernels.txt"
