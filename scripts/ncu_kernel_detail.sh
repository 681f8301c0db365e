#!/usr/bin/env bash
# ncu's throughput, scheduler, occupancy and shared-memory counters of one kernel
# of an SSA decode (paper shape, 1M tokens, batch 1, 50x unless benchmark
# arguments pick another case): what bounds it (issue slots, the shared-memory
# pipe, atomics, bank conflicts, occupancy). Run on the GPU machine after
# scripts/gpu_check.sh has built the benchmark.
#   bash scripts/ncu_kernel_detail.sh BENCH_BINARY KERNEL_REGEX [gpu_decode_bench arguments]
#   e.g. bash scripts/ncu_kernel_detail.sh build-gpu/bench/gpu_decode_bench pq_score_kernel
set -uo pipefail
# The Abseil and xxHash that scripts/gpu_check.sh unpacked for the build.
. "$(dirname "$0")/gpu_prefix.sh"
ssa_prefix_libs
shared=l1tex__data_pipe_lsu_wavefronts_mem_shared
SSA_BENCH_PROFILE=1 ncu --clock-control none -k "regex:$2" --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
  --section WarpStateStats --section InstructionStats --section Occupancy \
  --metrics "$shared.sum,$shared.sum.pct_of_peak_sustained_elapsed,${shared}_op_ld.sum,${shared}_op_st.sum,${shared}_op_atom.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_atom.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg" \
  "$1" --methods ssa "${@:3}" 2>&1 | grep -v '^==PROF==' | sed -n "/$2/,\$p" | grep -v '^ *$'
