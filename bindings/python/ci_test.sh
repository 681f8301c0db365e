#!/usr/bin/env bash
# CI step of the Python package as users get it: installs it the one way the
# README gives (pip install ./bindings/python, which builds libssa), with
# transformers and SmolLM2 (install_hf.sh), then runs the ssa.hf suite (random
# tiny Llama / Gemma-3 models, and SmolLM2-135M on a 2K-token prompt) and the
# evaluation's model-free tests against it. SSA_BINDING_SUITE=1 also runs the
# binding's own suite (bindings/python/tests) against this install; CI runs that
# suite against its build folder (bindings/test_all.sh) and against the CPU
# wheel (wheel_test.sh), built from the same sources with the same flags as this
# install (on a machine without a GPU, in the same build folder: relinked only).
# Run from anywhere; exits non-zero on the first failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
t0=$SECONDS
bash "$ROOT/bindings/python/install_hf.sh"
echo "install: $((SECONDS - t0))s"
cd "$ROOT"  # the source tree's ssa/ (no compiled parts) must not shadow the installed package
t1=$SECONDS
if [ "${SSA_BINDING_SUITE:-0}" = 1 ]; then "$PY" -m pytest -q -p no:cacheprovider bindings/python/tests; fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$PY" -m pytest -q -rs -s -p no:cacheprovider -W ignore::FutureWarning bindings/python/tests_hf 2>&1 | tee "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
# Everything is installed above: a skipped model test here is a failure.
if grep -qE '^SKIPPED|[0-9]+ skipped' "$log"; then echo "ci_test.sh: ssa.hf tests were skipped" >&2; exit 1; fi
# The evaluation's own pieces that need no model (task generators, intervals, the
# snapshot reader of eval/pq_proxy.py).
"$PY" -m pytest -q -p no:cacheprovider eval/test_eval.py
echo "tests: $((SECONDS - t1))s"
