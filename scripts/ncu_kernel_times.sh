#!/usr/bin/env bash
# Kernel times of one profiled benchmark run: ncu's gpu__time_duration of every
# kernel gpu_decode_bench launches with SSA_BENCH_PROFILE=1 (the setup kernels, a
# dense decode, a PQ_TOPK and an SSA decode at 50x; paper shape, 1M tokens, batch
# 1 unless the benchmark arguments pick another case), one "kernel unit time"
# line each. The full ncu output goes to LOG.
#   bash scripts/ncu_kernel_times.sh BENCH_BINARY LOG [gpu_decode_bench arguments]
#   e.g. ... LOG --configs llama8b --contexts 128K --methods dense,ssa
set -uo pipefail
BENCH=$1 LOG=$2
shift 2
SSA_BENCH_PROFILE=1 ncu --clock-control none --metrics gpu__time_duration.sum "$BENCH" "$@" >"$LOG" 2>&1
grep -E "^  [a-zA-Z_].*\(|gpu__time" "$LOG" | paste - - |
  sed -E 's/\((ssa::)?DecodeBatch.*Context/ /; s/^ *(void )?//' | awk '{print $1, $(NF-1), $NF}'
