#!/usr/bin/env python3
"""Fidelity of libssa's decode methods inside real models, through transformers
and ssa.hf (SmolLM2-135M-Instruct and Gemma-3-270M, eval/models.py).

  python eval/fidelity.py doc --model gemma3 --doc pydoc_topics --length 32768
      a real document (eval/documents.py): its first length - 64 tokens are
      prefilled densely, then 32 held-out tokens are fed step by step through the
      cache with each method and sparsity. Records the attention error of every
      libssa decode against DENSE (same session and query), next-token agreement
      with the DENSE run, and the log-likelihood of the continuation.
  python eval/fidelity.py ruler --model smollm2 --task niah_single --length 4096 --seed 0
      a RULER-style task (eval/ruler.py): each question of the context is decoded
      through the cache, then the greedy answer; correct iff it contains every
      expected string.
  python eval/fidelity.py proxy --model gemma3 --doc pydoc_topics --length 32768
      PQ proxy quality per layer: recall of the exact top-k by the PQ proxy's top-k,
      read from the session's own codebooks and codes (eval/pq_proxy.py).
  python eval/fidelity.py doc --model smollm2 --doc pydoc_topics --length 8192 \
          --groups off mixture mean_query --traces DIR
      group selection against per-head selection at equal rows read
      (eval/equal_rows.py): each method and sparsity per-head ("off") and with
      each group proposal; results in eval/results/*-groups.json. --traces
      writes every decode's selected rows to DIR (eval/trace_log.py) for
      eval/trace_replay.py (also without --groups).
  python eval/fidelity.py report
      tables from eval/results/*.json into eval/results/tables.md.

Dense prefills are computed by eval/prefill_all.py (or on demand here) and cached
under ~/.cache/libssa-eval.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import harness  # noqa: E402
import models  # noqa: E402
import plan  # noqa: E402
import prefill_store  # noqa: E402
import ruler  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def save(name, obj):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name), "w") as f:
        json.dump(obj, f, indent=None, separators=(",", ":"))
    print("wrote eval/results/%s" % name, flush=True)


def stored_prefill(args, ids, m):
    """The cached dense prefill of ids, computed first if missing: with the loaded
    model itself, whose "ssa" attention is transformers' sdpa when the cache is not
    an SSACache."""
    if not prefill_store.have(args.model, ids):
        print("no cached prefill of these %d tokens: computing it (dense)" % len(ids), flush=True)
        prefill_store.compute(m, ids)
    return prefill_store.load(args.model, ids)


def model_meta(m):
    c = m.config
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    return dict(model=m.name, gguf=os.path.basename(m.gguf_path), layers=c.num_hidden_layers,
                q_heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
                libssa_layers=[i for i, t in enumerate(types) if t == "full_attention"])


def run_configs(args):
    """(method, sparsity, group) of this piece; group "off" without --groups."""
    if args.groups:
        return harness.group_configs(args.methods, args.sparsities, args.groups)
    return [(m, sp, "off") for m, sp in harness.configs(args.methods, args.sparsities)]


def traced(args):
    return bool(args.groups) or bool(args.traces)


def start_trace(args, rec, m, name, meth, sp, group, ns):
    """A TraceLog for this configuration when --traces is given."""
    if not args.traces or meth == "dense":   # a dense decode reads every row: nothing to replay
        rec.trace_log = None
        return
    import trace_log
    c = m.config
    rec.trace_log = trace_log.TraceLog(dict(model=args.model, piece=name, method=meth, sparsity=sp,
                                            group_selection=group, n_q_heads=c.num_attention_heads,
                                            n_kv_heads=c.num_key_value_heads, n_sink=ns, n_local=ns,
                                            page_tokens=256, heavy_fraction=harness.HEAVY_FRACTION,
                                            seed=harness.SEED))
    rec.trace_log_path = os.path.join(args.traces, "%s-%s-%s-%g-%s.npz" % (args.model, name, meth, sp, group))


def end_trace(rec):
    if rec.trace_log is not None:
        os.makedirs(os.path.dirname(rec.trace_log_path), exist_ok=True)
        rec.trace_log.save(rec.trace_log_path)
        print("  wrote %s (%d head traces)" % (rec.trace_log_path, len(rec.trace_log)), flush=True)
        rec.trace_log = None


def suffix(args):
    return "-groups" if args.groups else ""


# ------------------------------------------------------------------------ documents

def cmd_doc(args, m=None):
    m = m or models.load(args.model)
    run = plan.doc_run(m, args.doc, args.length)
    N = run.n_context
    stored = stored_prefill(args, run.ids[:N], m)
    ns = args.sink_local if args.sink_local is not None else harness.sink_local(N)
    rec = harness.Recorder()
    with harness.Timer() as t:
        base = harness.make_base(m, stored, rec, ns, traced=traced(args))
    print("%s %s: context %d, sink+local %d+%d, base cache %.1fs" % (args.model, args.doc, N, ns, ns, t.s),
          flush=True)
    feed = run.ids[N:N + args.steps + 1]
    rows = []
    for meth, sp, group in run_configs(args):
        rec.reset()
        rec.active = meth != "dense"
        start_trace(args, rec, m, "doc-%s-%d" % (args.doc, args.length), meth, sp, group, ns)
        c = harness.fork_for(base, rec, meth, sp, group)
        with harness.Timer() as t:
            r = harness.teacher_forced(m, c, N, stored["logits"], feed)
        end_trace(rec)
        r.update(method=meth, sparsity=sp, group_selection=group, seconds=round(t.s, 1), **rec.summary())
        r["layer_head_err"] = {str(l): v for l, v in rec.err.items()} if args.head_errors else None
        rows.append(r)
        print("  %-15s %4gx %-10s err %.4f  ll %.3f  read %.4f  distinct/KV %s  %.0fs" % (
            meth, sp, group, r["err_mean"], sum(r["logps"]) / len(r["logps"]), r["read_fraction"],
            "%.4f" % r["distinct_fraction"] if r["distinct_fraction"] is not None else "-", t.s), flush=True)
        del c
    tag = "" if args.sink_local is None else "-sl%d" % ns
    save("%s-doc-%s-%d%s%s.json" % (args.model, args.doc, args.length, tag, suffix(args)),
         dict(kind="group_doc" if args.groups else "doc", doc=args.doc, source=__import__("documents").describe(args.doc), length=args.length,
              context=N, steps=len(feed) - 1, sink=ns, local=ns, heavy_fraction=harness.HEAVY_FRACTION,
              seed=harness.SEED, targets=list(map(int, feed[1:])), meta=model_meta(m), runs=rows))


# ------------------------------------------------------------------------ RULER

def cmd_ruler(args, m=None):
    m = m or models.load(args.model)
    ctx = plan.ruler_context(m, args.task, args.length, args.seed)
    ids = m.encode(ctx.prefix)
    N = len(ids)
    stored = stored_prefill(args, ids, m)
    ns = harness.sink_local(N)
    rec = harness.Recorder()
    base = harness.make_base(m, stored, rec, ns, traced=traced(args))
    print("%s %s L=%d seed %d: prefix %d tokens, %d questions, sink+local %d+%d" % (
        args.model, args.task, args.length, args.seed, N, len(ctx.questions), ns, ns), flush=True)
    questions = []
    for qi, q in enumerate(ctx.questions[: args.questions]):
        qids = m.encode(q.text, bos=False)
        runs = []
        for meth, sp, group in run_configs(args):
            rec.reset()
            rec.active = meth != "dense"
            start_trace(args, rec, m, "ruler-%s-%d-%d-q%d" % (args.task, args.length, args.seed, qi), meth, sp,
                        group, ns)
            c = harness.fork_for(base, rec, meth, sp, group)

            def done(gen, q=q):
                return ruler.score(q, m.decode(gen))

            def give_up(gen):
                # The answer is its first line: a newline after some text ends it.
                text = m.decode(gen).lstrip()
                return "\n" in text.rstrip("\n") or (text.endswith("\n") and text.strip() != "")
            with harness.Timer() as t:
                r = harness.answer(m, c, N, qids, q.max_new, done, give_up)
            end_trace(rec)
            text = m.decode(r["generated"])
            r.update(method=meth, sparsity=sp, group_selection=group, answer=text, correct=ruler.score(q, text), seconds=round(t.s, 1),
                     **rec.summary())
            runs.append(r)
            print("  q%d %-15s %4gx %-10s %-5s err %.4f read %.4f %.0fs  %r" % (
                qi, meth, sp, group, "OK" if r["correct"] else "--", r["err_mean"], r["read_fraction"], t.s,
                text[:60]), flush=True)
            del c
        questions.append(dict(text=q.text, answers=q.answers, question_tokens=len(qids), runs=runs))
    save("%s-ruler-%s-%d-%d%s.json" % (args.model, args.task, args.length, args.seed, suffix(args)),
         dict(kind="group_ruler" if args.groups else "ruler", task=args.task, length=args.length, seed=args.seed, context=N, needles=ctx.needles,
              sink=ns, local=ns, heavy_fraction=harness.HEAVY_FRACTION, meta=model_meta(m), questions=questions))


# ------------------------------------------------------------------------ proxy quality

def cmd_proxy(args, m=None):
    import pq_proxy
    m = m or models.load(args.model)
    run = plan.doc_run(m, args.doc, args.length)
    N = run.n_context
    stored = stored_prefill(args, run.ids[:N], m)
    res = pq_proxy.measure(m, stored, run.ids[N:N + args.steps], args.fractions,
                           os.path.join(prefill_store.CACHE_DIR, "proxy-%s.ssa" % args.model))
    save("%s-proxy-%s-%d.json" % (args.model, args.doc, args.length),
         dict(kind="proxy", doc=args.doc, length=args.length, context=N, steps=args.steps, meta=model_meta(m),
              **res))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doc")
    d.add_argument("--doc", choices=plan.DOC_NAMES, required=True)
    d.add_argument("--head-errors", action="store_true", help="keep every (layer, step, head) error")
    d.add_argument("--sink-local", type=int, default=None, help="override N/256 (an ablation)")
    d.add_argument("--steps", type=int, default=plan.DOC_STEPS, help="teacher-forced steps (<= %d)" % plan.DOC_STEPS)
    r = sub.add_parser("ruler")
    r.add_argument("--task", choices=ruler.TASKS, required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--questions", type=int, default=None, help="ask only the first N questions of the context")
    p = sub.add_parser("proxy")
    p.add_argument("--doc", choices=plan.DOC_NAMES, required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--fractions", nargs="+", type=float, default=[0.1, 0.05, 0.02])
    for x in (d, r, p):
        x.add_argument("--model", required=True, choices=sorted(models.GGUF))
        x.add_argument("--length", type=int, required=True)
        x.add_argument("--threads", type=int, default=1)
    for x in (d, r):
        x.add_argument("--methods", nargs="+", default=harness.METHODS, choices=harness.METHODS)
        x.add_argument("--sparsities", nargs="+", type=float, default=harness.SPARSITIES)
        x.add_argument("--groups", nargs="+", choices=harness.GROUPS, default=None,
                       help="compare group selections at equal rows read (off = per-head)")
        x.add_argument("--traces", default=None, help="write every decode's selected rows to this folder")
    sub.add_parser("report")
    b = sub.add_parser("batch", help="several pieces in one process (the model loaded once)")
    b.add_argument("--model", required=True, choices=sorted(models.GGUF))
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("pieces", nargs="+", help="argument lists of doc/ruler/proxy, each as one string, "
                   "e.g. 'doc --doc pydoc_topics --length 32768'")
    args = ap.parse_args()
    if args.cmd == "batch":
        torch.set_num_threads(args.threads)
        m = models.load(args.model)
        for piece in args.pieces:
            a = ap.parse_args(piece.split() + ["--model", args.model, "--threads", str(args.threads)])
            print("== %s" % piece, flush=True)
            with harness.Timer() as t:
                {"doc": cmd_doc, "ruler": cmd_ruler, "proxy": cmd_proxy}[a.cmd](a, m)
            print("== done in %.0fs" % t.s, flush=True)
        return
    if args.cmd == "report":
        import report
        report.main()
        return
    torch.set_num_threads(args.threads)
    {"doc": cmd_doc, "ruler": cmd_ruler, "proxy": cmd_proxy}[args.cmd](args)


if __name__ == "__main__":
    main()
