#!/usr/bin/env bash
# Attention split counts swept on the GPU machine in one call: our dense kernel
# at batch 16 and the sparse gather (SSA 50x) at batch 1, one gpu_decode_bench run
# per split count, the automatic choice (0) first and last (a drift check). Each
# line: the case, its time and the split count it ran with. The log goes to
# $OUT/split_sweep.log.
#   SSA_DEBS=.debs [SSA_DENSE_SPLITS="0 2 4 ..."] [SSA_SPARSE_SPLITS="0 8 ..."] bash scripts/gpu_split_sweep.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
export OUT
SSA_GPU_STAGES=build bash scripts/gpu_check.sh || exit 1
. "$(dirname "$0")/gpu_prefix.sh"
ssa_prefix_libs
BENCH=build-gpu/bench/gpu_decode_bench
LOG="$OUT/split_sweep.log"
: >"$LOG"
for n in ${SSA_DENSE_SPLITS:-0 2 4 8 16 33 66 0}; do
  echo "### dense splits $n" | tee -a "$LOG"
  "$BENCH" --configs paper,llama8b --contexts 128K,1M --batches 16 --methods dense --seeds 1 \
    --dense-splits "$n" 2>&1 | grep ' ms, graph' | tee -a "$LOG"
done
for n in ${SSA_SPARSE_SPLITS:-0 8 16 24 33 48 66 0}; do
  echo "### sparse splits $n" | tee -a "$LOG"
  "$BENCH" --configs paper,llama8b --contexts 128K,1M --batches 1 --sparsity 50 --methods ssa --seeds 1 \
    --sparse-splits "$n" 2>&1 | grep ' ms, graph' | tee -a "$LOG"
done
