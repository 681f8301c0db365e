#!/usr/bin/env bash
# Warp-stall profile of one kernel of an SSA decode (paper shape, 1M tokens,
# batch 1, 50x unless benchmark arguments pick another case): ncu's source
# counters of its first launch, summed per stall reason and per opcode by
# scripts/ncu_hotspots.py. Run on the GPU machine, after scripts/gpu_check.sh has
# built the benchmark.
#   bash scripts/ncu_stalls.sh BENCH_BINARY KERNEL_REGEX [TOP [gpu_decode_bench arguments]]
#   e.g. ... sample_kernel 30 --configs llama8b --contexts 128K
set -uo pipefail
# The Abseil and xxHash that scripts/gpu_check.sh unpacked for the build.
. "$(dirname "$0")/gpu_prefix.sh"
ssa_prefix_libs
rep=/tmp/ncu_stalls_$$
SSA_BENCH_PROFILE=1 ncu --clock-control none -k "regex:$2" --launch-count 1 \
  --section SourceCounters --section WarpStateStats -o "$rep" "$1" --methods ssa "${@:4}" >"$rep.log" 2>&1 ||
  { tail -20 "$rep.log"; exit 1; }
ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>/dev/null
python3 "$(dirname "$0")/ncu_hotspots.py" "$rep.csv" --top "${3:-30}"
rm -f "$rep.ncu-rep" "$rep.csv" "$rep.log"
