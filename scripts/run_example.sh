#!/usr/bin/env bash
# The main job. Installs dependencies, then
#   1. answers a question about a long document with a real model
#      (SmolLM2-135M-Instruct through Hugging Face transformers; its decode
#      attention served by libssa through ssa.hf, with SSA and with DENSE for
#      comparison): eval/run_demo.sh, which installs the Python package
#      (pip install ./bindings/python builds libssa) with torch and transformers;
#      arguments go to eval/demo.py, e.g. --doc FILE --question "..." --sparsity 20;
#   2. times DENSE, PQ top-k and SSA on a synthetic 128K-token session
#      (examples/long_context_demo, compiled here against the libssa that step 1
#      installed with the Python package: the library is built once).
# Runs on the GPU where one is present and on the CPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
echo "== long-document question answering (SmolLM2-135M via transformers, decode attention through libssa)"
bash eval/run_demo.sh "$@"
echo
echo "== synthetic 128K-token session: DENSE vs PQ top-k vs SSA at 50x"
# The libssa inside the package pip just installed (Release; the CUDA backend
# where a GPU is present), so the library is not compiled a second time. A
# package that links a libssa built elsewhere (SSA_LIB_DIR) carries none: then
# build one in build-example with CMake, its CUDA backend only where a GPU is
# there to run it (its kernels take long to compile).
PY=${PYTHON:-python3}
pkg="$(cd / && "$PY" -c 'import os, ssa; print(os.path.dirname(ssa.__file__))')"
lib="$(ls "$pkg"/libssa.so.* 2>/dev/null | head -n1 || true)"
if [ -n "$lib" ]; then
  mkdir -p build-example/examples
  "${CXX:-c++}" -O3 -std=c++17 -Iinclude -Itests examples/long_context_demo.cc "$lib" -Wl,-rpath,"$pkg" \
    -o build-example/examples/long_context_demo
else
  cuda=OFF
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; fi
  cmake -S . -B build-example -DCMAKE_BUILD_TYPE=Release -DSSA_BUILD_TESTS=OFF -DSSA_BUILD_BENCH=OFF \
    -DSSA_ENABLE_CUDA="$cuda" >/dev/null
  cmake --build build-example -j"$(nproc)" --target long_context_demo
fi
./build-example/examples/long_context_demo
