#!/usr/bin/env bash
# The ncu driver: Nsight Compute over one profiled run of gpu_decode_bench
# (SSA_BENCH_PROFILE=1: the setup kernels, then one decode per method; paper
# shape, 1M tokens, batch 1, 50x unless the benchmark arguments pick another
# case). Run on the GPU machine after `scripts/gpu.sh check` (stage build) has
# built the benchmark; SSA_BENCH names another binary.
#
#   bash scripts/ncu.sh times LOG [BENCH ARGS]          every kernel's time, one
#        "kernel unit time" line each; the full ncu output goes to LOG
#   bash scripts/ncu.sh detail KERNEL_REGEX [BENCH ARGS]   throughput, scheduler,
#        occupancy and shared-memory counters of the first launch of one kernel
#        (issue slots, the shared-memory pipe, atomics, bank conflicts)
#   bash scripts/ncu.sh stalls KERNEL_REGEX [BENCH ARGS]   its warp-stall samples
#        per SASS instruction, opcode and reason (scripts/ncu_hotspots.py, the
#        top $SSA_NCU_TOP rows, default 30)
#
# e.g. bash scripts/ncu.sh detail pq_score_kernel
#      bash scripts/ncu.sh stalls sample_kernel --configs llama8b --contexts 128K
# detail and stalls profile the SSA decode only (--methods ssa comes first, so
# BENCH ARGS may pick another method).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=${SSA_BENCH:-${SSA_GPU_BUILD:-build-gpu}/bench/gpu_decode_bench}
# The Abseil and xxHash that scripts/gpu.sh unpacked for the build.
export LD_LIBRARY_PATH=/tmp/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
profile() { SSA_BENCH_PROFILE=1 ncu --clock-control none "$@"; }

cmd_times() {
  local log=$1
  shift
  profile --metrics gpu__time_duration.sum "$BENCH" "$@" >"$log" 2>&1
  grep -E "^  [a-zA-Z_].*\(|gpu__time" "$log" | paste - - |
    sed -E 's/\((ssa::)?DecodeBatch.*Context/ /; s/^ *(void )?//' | awk '{print $1, $(NF-1), $NF}'
}

cmd_detail() {
  local kernel=$1 shared=l1tex__data_pipe_lsu_wavefronts_mem_shared
  shift
  profile -k "regex:$kernel" --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section InstructionStats --section Occupancy \
    --metrics "$shared.sum,$shared.sum.pct_of_peak_sustained_elapsed,${shared}_op_ld.sum,${shared}_op_st.sum,${shared}_op_atom.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_atom.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg" \
    "$BENCH" --methods ssa "$@" 2>&1 | grep -v '^==PROF==' | sed -n "/$kernel/,\$p" | grep -v '^ *$'
}

cmd_stalls() {
  local kernel=$1 rep=/tmp/ncu_stalls_$$
  shift
  profile -k "regex:$kernel" --launch-count 1 --section SourceCounters --section WarpStateStats \
    -o "$rep" "$BENCH" --methods ssa "$@" >"$rep.log" 2>&1 || { tail -20 "$rep.log"; exit 1; }
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>/dev/null
  python3 "$HERE/ncu_hotspots.py" "$rep.csv" --top "${SSA_NCU_TOP:-30}"
  rm -f "$rep.ncu-rep" "$rep.csv" "$rep.log"
}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
cmd=${1:-}
case "$cmd" in
  times | detail | stalls) [ $# -ge 2 ] || usage ;;
  *) usage ;;
esac
shift
"cmd_$cmd" "$@"
