#!/usr/bin/env bash
# The name the GPU check has always had: scripts/gpu.sh check (stages in
# SSA_GPU_STAGES, e.g. SSA_DEBS=.debs SSA_GPU_STAGES=build,test bash scripts/gpu_check.sh).
exec bash "$(dirname "$0")/gpu.sh" check "$@"
