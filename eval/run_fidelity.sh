#!/usr/bin/env bash
# Runs fidelity pieces through transformers + ssa.hf, all pieces of one model in one
# process (the model is loaded once), then writes eval/results/tables.md. Dense
# prefills are cached under ~/.cache/libssa-eval (SSA_EVAL_CACHE): computed by the
# first piece that needs one, reused by every later one.
# Usage: eval/run_fidelity.sh PIECE...
#   doc-MODEL-DOC-LENGTH[-STEPS]      a document (pydoc_topics, licenses, pydecimal) at a
#                                     window length; STEPS teacher-forced tokens (default 32)
#   ruler-MODEL-TASK-LENGTH-SEED[-Q]  a RULER context (niah_single niah_multikey
#                                     niah_multivalue variable_tracking); its first Q questions
#   proxy-MODEL-DOC-LENGTH            PQ proxy recall/mass per libssa layer (4 steps)
#   sl-MODEL-DOC-LENGTH-N             the document at 50x with sink = local = N (ablation)
#   gdoc-MODEL-DOC-LENGTH[-STEPS]     group selection (mixture, mean_query) against per-head
#                                     selection at equal rows read (eval/equal_rows.py): the
#                                     methods of $GROUP_METHODS (default pq_topk ssa ssa_adaptive)
#                                     at 10/20/50x; eval/results/*-groups.json
#   gruler-MODEL-TASK-LENGTH-SEED[-Q] the same on a RULER context
#   recorded                          every piece docs/FIDELITY.md reports
#   group-recorded                    every group-selection piece docs/FIDELITY.md reports
#   report                            only the tables
# MODEL: smollm2 or gemma3. Needs ssa (with ssa.hf) importable: pip install ./bindings/python.
# SSA_EVAL_TRACES=DIR: every piece also writes the rows each decode selected to DIR
# (eval/trace_log.py), for eval/trace_replay.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
RECORDED="doc-smollm2-pydoc_topics-8192-16 ruler-smollm2-niah_single-8192-0-1 ruler-smollm2-niah_multikey-8192-0-1
  ruler-smollm2-niah_multivalue-8192-0-1 proxy-smollm2-pydoc_topics-8192
  ruler-smollm2-niah_single-4096-0-1 ruler-smollm2-variable_tracking-4096-0-1
  ruler-smollm2-niah_multikey-4096-0-1 ruler-smollm2-niah_multivalue-4096-0-1
  ruler-smollm2-niah_single-4096-1 ruler-smollm2-niah_multikey-4096-1-2
  doc-gemma3-pydoc_topics-32768 proxy-gemma3-pydoc_topics-32768 sl-gemma3-pydoc_topics-32768-16
  doc-gemma3-pydoc_topics-16384 proxy-gemma3-pydoc_topics-16384
  ruler-gemma3-niah_single-16384-0-1 ruler-gemma3-niah_multikey-16384-0-1
  ruler-gemma3-variable_tracking-16384-0-1 ruler-gemma3-niah_multivalue-16384-0-1"
GROUP_METHODS=${GROUP_METHODS:-"pq_topk ssa ssa_adaptive"}
GROUP_RECORDED="gdoc-smollm2-pydoc_topics-8192-20 gruler-smollm2-niah_single-4096-0 gruler-smollm2-niah_single-4096-1
  gruler-smollm2-niah_multikey-4096-0-1 gruler-smollm2-variable_tracking-4096-0-1
  gdoc-gemma3-pydoc_topics-16384-16 gruler-gemma3-niah_single-16384-0 gruler-gemma3-niah_multikey-16384-0
  gruler-gemma3-niah_multivalue-16384-0"
TR=${SSA_EVAL_TRACES:+ --traces $SSA_EVAL_TRACES}
G="--groups off mixture mean_query --methods dense $GROUP_METHODS"
declare -A batch
order=()
add() { [ -n "${batch[$1]+x}" ] || order+=("$1"); batch[$1]+="$2"$'\n'; }
args=("$@")
[ "${args[0]:-}" = recorded ] && args=($RECORDED)
[ "${args[0]:-}" = group-recorded ] && args=($GROUP_RECORDED)
for p in "${args[@]}"; do
  IFS=- read -r kind model a b c d <<<"$p"
  case "$kind" in
    doc)   add "$model" "doc --doc $a --length $b${c:+ --steps $c}$TR" ;;
    ruler) add "$model" "ruler --task $a --length $b --seed $c${d:+ --questions $d}$TR" ;;
    gdoc)  add "$model" "doc --doc $a --length $b${c:+ --steps $c} $G$TR" ;;
    gruler) add "$model" "ruler --task $a --length $b --seed $c${d:+ --questions $d} $G$TR" ;;
    proxy) add "$model" "proxy --doc $a --length $b --steps 4" ;;
    sl)    add "$model" "doc --doc $a --length $b --sink-local $c --methods pq_topk oracle_topk ssa --sparsities 50" ;;
    report) ;;
    *) echo "unknown piece $p" >&2; exit 2 ;;
  esac
done
for m in "${order[@]}"; do
  mapfile -t pieces < <(printf '%s' "${batch[$m]}")
  echo "== $m: ${#pieces[@]} piece(s)"
  t0=$SECONDS
  nice -n 10 python3 eval/fidelity.py batch --model "$m" "${pieces[@]}"
  echo "== $m done in $((SECONDS - t0))s"
done
python3 eval/fidelity.py report > /dev/null
echo "tables: eval/results/tables.md"
