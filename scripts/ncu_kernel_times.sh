#!/usr/bin/env bash
# Kernel times of one profiled benchmark run: ncu's gpu__time_duration of every
# kernel gpu_decode_bench launches with SSA_BENCH_PROFILE=1 (the setup kernels, a
# dense decode, a PQ_TOPK and an SSA decode at 1M tokens), one "kernel unit time"
# line each. The full ncu output goes to LOG.
#   bash scripts/ncu_kernel_times.sh BENCH_BINARY LOG
set -uo pipefail
SSA_BENCH_PROFILE=1 ncu --clock-control none --metrics gpu__time_duration.sum "$1" >"$2" 2>&1
grep -E "^  [a-zA-Z_].*\(|gpu__time" "$2" | paste - - |
  sed -E 's/\((ssa::)?DecodeBatch.*Context/ /; s/^ *(void )?//' | awk '{print $1, $(NF-1), $NF}'
