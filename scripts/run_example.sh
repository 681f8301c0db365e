#!/usr/bin/env bash
# The main job: installs dependencies, builds libssa (with the CUDA backend when a
# CUDA compiler exists), then
#   1. answers a question about a long document on this machine with a real model
#      (SmolLM2-135M-Instruct, offline from PyPI), its decode attention served by
#      libssa with SSA and, for comparison, dense (eval/run_demo.sh; arguments go
#      to eval/demo.py, e.g. --doc FILE --question "..." --sparsity 50);
#   2. times DENSE, PQ top-k and SSA on a synthetic 128K-token session
#      (examples/long_context_demo).
# libssa runs on the GPU where one is present and on the CPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSSA_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target ssa long_context_demo
echo "== long-document question answering (SmolLM2-135M, decode attention through libssa)"
SSA_BUILD_DIR="$PWD/build" bash eval/run_demo.sh "$@"
echo
echo "== synthetic 128K-token session: DENSE vs PQ top-k vs SSA at 50x"
./build/examples/long_context_demo
