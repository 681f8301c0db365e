#!/usr/bin/env bash
# Runs the fidelity evaluation through transformers + ssa.hf in short pieces (one
# process each), then writes eval/results/tables.md. Dense prefills are cached
# under ~/.cache/libssa-eval (SSA_EVAL_CACHE), so a piece run again, or another
# piece of the same context, does not recompute them.
# Usage: eval/run_fidelity.sh PIECE...
#   prefill-MODEL            the dense prefills of every document and RULER context of MODEL
#   doc-MODEL-DOC-LENGTH     a document (pydoc_topics, licenses, pydecimal) at a window length
#   ruler-MODEL-TASK-LENGTH-SEED   a RULER context (tasks: niah_single niah_multikey
#                            niah_multivalue variable_tracking)
#   proxy-MODEL-DOC-LENGTH   PQ proxy recall/mass per libssa layer
#   sl-MODEL-DOC-LENGTH-N    the document at 50x with sink = local = N (ablation)
#   report                   the tables (also run at the end of every invocation)
#   smollm2 | gemma3         every piece of a model as recorded in docs/FIDELITY.md
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
PY="nice -n 10 python3"
TASKS="niah_single niah_multikey niah_multivalue variable_tracking"
run() { echo "== $*"; local t0=$SECONDS; $PY "$@"; echo "== done in $((SECONDS - t0))s"; }
expand() {
  case "$1" in
    smollm2) for L in 4096 8192; do for t in $TASKS; do echo ruler-smollm2-$t-$L-0; done;
             for d in pydoc_topics licenses pydecimal; do echo doc-smollm2-$d-$L; done; done ;;
    gemma3)  for L in 16384 32768; do for t in $TASKS; do echo ruler-gemma3-$t-$L-0; done; done
             echo doc-gemma3-pydoc_topics-32768 doc-gemma3-pydoc_topics-16384 proxy-gemma3-pydoc_topics-32768
             echo sl-gemma3-pydoc_topics-32768-16 ;;
    *) echo "$1" ;;
  esac
}
pieces=()
for a in "$@"; do for p in $(expand "$a"); do pieces+=("$p"); done; done
for p in "${pieces[@]}"; do
  IFS=- read -r kind model a b c <<<"$p"
  case "$kind" in
    prefill) run eval/prefill_all.py --model "$model" --docs pydoc_topics licenses pydecimal --tasks $TASKS ;;
    doc)     run eval/fidelity.py doc --model "$model" --doc "$a" --length "$b" ;;
    ruler)   run eval/fidelity.py ruler --model "$model" --task "$a" --length "$b" --seed "$c" ;;
    proxy)   run eval/fidelity.py proxy --model "$model" --doc "$a" --length "$b" ;;
    sl)      run eval/fidelity.py doc --model "$model" --doc "$a" --length "$b" --sink-local "$c" \
               --methods pq_topk oracle_topk ssa --sparsities 50 ;;
    report)  ;;
    *) echo "unknown piece $p" >&2; exit 2 ;;
  esac
done
python3 eval/fidelity.py report > /dev/null
echo "tables: eval/results/tables.md"
