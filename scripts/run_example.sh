#!/usr/bin/env bash
# The main job: install dependencies, build libssa (with the CUDA backend when a
# CUDA compiler exists) and run the long-context example. The runtime picks the
# GPU when one is present and the CPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSSA_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target long_context_demo
./build/examples/long_context_demo "$@"
