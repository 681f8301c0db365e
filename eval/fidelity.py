#!/usr/bin/env python3
"""Fidelity of libssa's sparse decode methods on a real model (SmolLM2-135M).

  python eval/fidelity.py doc --doc gpl3 [--methods ...] [--steps 32]
      long document from this machine: dense prefill of N tokens, then `steps`
      teacher-forced decode steps of the held-out continuation per method and
      sparsity. Records per-layer relative L2 error of the attention output vs
      DENSE (same session, same query), next-token agreement with the DENSE run,
      and the mean log-likelihood of the continuation.
  python eval/fidelity.py passkey --length 4000 --trial 0
      a pass key buried in filler text; the question and the answer are decoded
      through libssa with each method and sparsity.
  python eval/fidelity.py errtarget --doc gpl3 [--method ssa] [--eps 0.02 0.05 0.1 0.2]
      error-targeted decode (target_error = eps, target_delta = 0.1) over the same
      documents and steps: per eps, the fraction of (layer, head, step) decodes whose
      error against DENSE is <= eps, the mean error, and the rows read.
  python eval/fidelity.py report
      aggregates eval/results/*.json into docs/FIDELITY.md and docs/fidelity_*.png.

Each run writes JSON under eval/results/ (one file per document/method or per
passkey trial), so the evaluation can be run in short pieces.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import sysconfig
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets thread limits before numpy)
import numpy as np  # noqa: E402
from numpy_decoder import NumpyCache  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


def documents():
    std = sysconfig.get_paths()["stdlib"]
    return {
        "gpl3": "/usr/share/common-licenses/GPL-3",
        "gfdl13": "/usr/share/common-licenses/GFDL-1.3",
        "textwrap": os.path.join(std, "textwrap.py"),
    }


def prefix(args):
    """Result file prefix: none for SmolLM2 (the main evaluation), else the model."""
    return "" if getattr(args, "model", "smollm2") == "smollm2" else args.model + "-"


def encode_doc(model, text):
    return ([model.tok.bos] if getattr(model, "add_bos", False) else []) + model.tok.encode(text)


def configs(methods, sparsities=None):
    out = []
    for m in methods:
        if m == "dense":
            out.append((m, 1.0))
        else:
            out.extend((m, float(s)) for s in (sparsities or common.SPARSITIES))
    return out


def save(name, obj, indent=1):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name), "w") as f:
        json.dump(obj, f, indent=indent)


# ------------------------------------------------------------------------ documents

def cmd_doc(args):
    model = common.load_model(args.model)
    path = documents()[args.doc]
    ids = encode_doc(model, open(path, encoding="utf-8").read())
    S = args.steps
    N = min(len(ids) - S - 1, args.max_context)
    if N < 1024:
        raise SystemExit("%s: only %d tokens" % (path, len(ids)))
    ids = ids[: N + S + 1]
    ns = common.sink_local(N)
    print("%s: %s, context %d tokens, %d decode steps, sink %d + local %d" % (
        args.doc, path, N, S, ns, ns), flush=True)
    logits0, K, V = common.cached_prefill(model, ids[:N])
    rt = common.runtime()
    t0 = time.time()
    base = common.build_session(rt, model, K, V)
    print("session + PQ index: %.1fs" % (time.time() - t0), flush=True)
    local = common.local_windows(model, K, V)
    del K, V
    feed = ids[N: N + S + 1]
    for method in args.methods:
        out_name = "%sdoc-%s-%s.json" % (prefix(args), args.doc, method)
        rows = []
        for m, sp in configs([method], args.sparsities):
            r = common.run_decode(model, base, N, logits0, feed, m, sp, ns, ns, ref_every=args.ref_every,
                                  local=local)
            r["targets"] = list(map(int, feed[1:]))
            e = [x for x in r["layer_err"] if x is not None]
            print("  %-15s %4gx  err %.4f  ll %.3f  read %.3f  %.0fs" % (
                m, sp, np.mean(e) if e else 0.0, np.mean(r["logps"]), r["read_fraction"], r["seconds"]),
                flush=True)
            rows.append(r)
        save(out_name, dict(model=args.model, doc=args.doc, path=path, context=N, steps=S, sink=ns, local=ns,
                            heavy_fraction=common.HEAVY_FRACTION, seed=common.SEED, runs=rows))
    base.close()


# ------------------------------------------------------------------------ error target

def cmd_errtarget(args):
    model = common.load_model(args.model)
    path = documents()[args.doc]
    ids = encode_doc(model, open(path, encoding="utf-8").read())
    S = args.steps
    N = min(len(ids) - S - 1, args.max_context)
    ids = ids[: N + S + 1]
    ns = common.sink_local(N)
    print("%s: context %d tokens, %d decode steps, sink %d + local %d, %s, delta %g" % (
        args.doc, N, S, ns, ns, args.method, args.delta), flush=True)
    logits0, K, V = common.cached_prefill(model, ids[:N])
    rt = common.runtime()
    base = common.build_session(rt, model, K, V)
    local = common.local_windows(model, K, V)
    del K, V
    feed = ids[N: N + S + 1]
    rows = []
    for eps in args.eps:
        # No floor (budget 0); the cap is the default N / 5, the 5x budget.
        kw = dict(target_error=eps, target_delta=args.delta)
        r = common.run_decode(model, base, N, logits0, feed, args.method, 50.0, ns, ns,
                              ref_every=args.ref_every, decode_kw=kw, head_errors=True, local=local)
        r["target_error"], r["target_delta"] = eps, args.delta
        r["targets"] = list(map(int, feed[1:]))
        e = np.array([x for row in r["head_errors"] for x in row[2:]])
        print("  eps %-5g  within %.3f  mean err %.4f  read %.4f  budget %.4f  capped %d/%d  %.0fs" % (
            eps, np.mean(e <= eps), e.mean(), r["read_fraction"], r["budget_fraction"], r["capped_heads"],
            r["head_decodes"], r["seconds"]), flush=True)
        rows.append(r)
    save("%serrtarget-%s-%s.json" % (prefix(args), args.doc, args.method),
         dict(model=args.model, doc=args.doc, path=path, context=N, steps=S, sink=ns, local=ns, method=args.method,
              heavy_fraction=common.HEAVY_FRACTION, seed=common.SEED, runs=rows),
         indent=None)  # every per-head error: compact
    base.close()


def interp_read(points, err):
    """Rows read by fixed-budget decoding at mean error `err`: log-log interpolation
    of the (read fraction, mean error) points; None outside their range."""
    pts = sorted(points, key=lambda p: p[1])
    for (r0, e0), (r1, e1) in zip(pts, pts[1:]):
        if e0 <= err <= e1 and e0 > 0:
            f = np.log(err / e0) / np.log(e1 / e0) if e1 > e0 else 0.0
            return float(np.exp(np.log(r0) + f * (np.log(r1) - np.log(r0))))
    return None


def errtarget_table(docs):
    """The error-target results against fixed-budget runs of the same method."""
    files = sorted(glob.glob(os.path.join(RESULTS, "errtarget-*.json")))
    if not files:
        return ""
    by = {}
    for f in files:
        d = json.load(open(f))
        for r in d["runs"]:
            by.setdefault((d["method"], r["target_error"], r["target_delta"]), []).append((d, r))
    lines = ["| method | target eps (delta) | decodes within eps | mean err | 90th pct err | rows read / N "
             "| budget / N | capped heads | fixed-budget rows read / N at equal mean err | rows saved |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (method, eps, delta), runs in sorted(by.items()):
        errs = np.array([x for _, r in runs for row in r["head_errors"] for x in row[2:]])
        read = np.mean([r["read_fraction"] for _, r in runs])
        budget = np.mean([r["budget_fraction"] for _, r in runs])
        capped = sum(r["capped_heads"] for _, r in runs)
        decodes = sum(r["head_decodes"] for _, r in runs)
        # Fixed-budget curve of the same method on the same documents (mean over them).
        pts = []
        for sp in common.SPARSITIES:
            rs = [docs[d["doc"]]["runs"].get((method, float(sp))) for d, _ in runs if d["doc"] in docs]
            rs = [x for x in rs if x is not None]
            if len(rs) == len(runs):
                le = [np.mean([y for y in x["layer_err"] if y is not None]) for x in rs]
                pts.append((np.mean([x["read_fraction"] for x in rs]), float(np.mean(le))))
        fixed = interp_read(pts, float(errs.mean())) if pts else None
        lines.append("| %s | %g (%g) | %.3f | %.4f | %.4f | %.4f | %.4f | %d / %d | %s | %s |" % (
            LABEL.get(method, method), eps, delta, np.mean(errs <= eps), errs.mean(), np.percentile(errs, 90),
            read, budget, capped, decodes, "%.4f" % fixed if fixed else "outside 5x-50x",
            "%.0f%%" % (100 * (1 - read / fixed)) if fixed else "-"))
    return "\n".join(lines)


# ------------------------------------------------------------------------ passkey

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n\n")
DEPTHS = [0.2, 0.5, 0.8, 0.35, 0.65]


def passkey_tokens(tok, length, trial):
    rng = np.random.default_rng(1000 + trial)
    key = int(rng.integers(10000, 100000))
    depth = DEPTHS[trial % len(DEPTHS)]
    # Plain completion format: with the chat template the model already fails
    # at 2K tokens densely; in this format it answers densely at 2K.
    head = tok.encode(INTRO)
    needle = tok.encode(" The pass key is %d. Remember it. %d is the pass key. " % (key, key))
    question = tok.encode("\n\nWhat is the pass key? The pass key is")
    unit = tok.encode(FILLER)
    n_fill = length - len(head) - len(needle) - len(question)
    filler = (unit * (n_fill // len(unit) + 1))[:n_fill]
    at = int(round(depth * n_fill))
    haystack = head + filler[:at] + needle + filler[at:]
    shared = head + filler[:at]
    return key, depth, shared, haystack, question


def passkey_filler(tok, length):
    """head + all filler tokens of a trial of this length, without the needle."""
    _, _, shared, haystack, _ = passkey_tokens(tok, length, 0)
    needle_len = len(tok.encode(" The pass key is 10000. Remember it. 10000 is the pass key. "))
    P = len(shared)
    return haystack[:P] + haystack[P + needle_len:]


def parse_key(text):
    import re
    m = re.search(r"\d[\d,]*", text)
    return int(m.group(0).replace(",", "")) if m else None


def cmd_passkey(args):
    model = common.smollm.SmolLM()
    tok = model.tok
    key, depth, shared, haystack, question = passkey_tokens(tok, args.length, args.trial)
    N = len(haystack)
    ns = common.sink_local(N + len(question))
    print("passkey length %d trial %d: key %d at depth %.2f, haystack %d tokens, question %d, sink/local %d" % (
        args.length, args.trial, key, depth, N, len(question), ns), flush=True)
    # The filler (without the needle) is the same for every trial of this length:
    # its dense prefill is cached once, and a trial recomputes only what follows
    # the needle's position.
    P = len(shared)
    no_needle = passkey_filler(tok, args.length)
    assert no_needle[:P] == shared
    _, fK, fV = common.cached_prefill(model, no_needle)
    t0 = time.time()
    logits0, K, V = model.prefill(haystack[P:], past=([k[:P] for k in fK], [v[:P] for v in fV]))
    print("prefill of %d tokens after %d cached: %.0fs" % (N - P, P, time.time() - t0), flush=True)
    del fK, fV
    rt = common.runtime()
    base = common.build_session(rt, model, K, V)
    del K, V

    def stop(gen):
        digits = sum(1 for c in tok.decode(gen) if c.isdigit())
        return digits >= 5 or tok.eos in gen

    rows = []
    for m, sp in configs(args.methods):
        r = common.run_decode(model, base, N, logits0, question, m, sp, ns, ns, n_generate=8, stop=stop)
        r["answer"] = tok.decode(r["generated"])
        r["correct"] = parse_key(r["answer"]) == key
        print("  %-15s %4gx  %-14r %s  %.0fs" % (m, sp, r["answer"], "OK" if r["correct"] else "--",
                                                  r["seconds"]), flush=True)
        rows.append(r)
    base.close()
    save("passkey-%d-%d.json" % (args.length, args.trial),
         dict(length=args.length, trial=args.trial, key=key, depth=depth, context=N + len(question),
              sink=ns, local=ns, runs=rows))


# ------------------------------------------------------------------------ report

LABEL = {"dense": "DENSE", "pq_topk": "PQ_TOPK", "oracle_topk": "ORACLE_TOPK",
         "hybrid_uniform": "HYBRID_UNIFORM (h=0.4)", "ssa": "SSA (h=0.4)", "ssa_adaptive": "SSA_ADAPTIVE"}


def cmd_report(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    pre = prefix(args)
    docs = {}
    for f in sorted(glob.glob(os.path.join(RESULTS, pre + "doc-*.json"))):
        d = json.load(open(f))
        docs.setdefault(d["doc"], dict(meta=d, runs={}))
        for r in d["runs"]:
            docs[d["doc"]]["runs"][(r["method"], r["sparsity"])] = r
    keys = []
    for m in common.METHODS:
        for sp in ([1.0] if m == "dense" else [float(s) for s in common.SPARSITIES]):
            keys.append((m, sp))
    lines = []
    lines.append("| document | context N | sink+local | continuation steps |")
    lines.append("|---|---|---|---|")
    for name, d in docs.items():
        meta = d["meta"]
        lines.append("| `%s` | %d | %d+%d | %d |" % (meta["path"], meta["context"], meta["sink"], meta["local"],
                                                     meta["steps"]))
    doc_table = "\n".join(lines)

    agg = {}
    lines = ["| method | sparsity | rows read / N | attn rel. L2 err (mean over layers) | worst layer err "
             "| top-1 agreement with DENSE | mean log-lik. | top-1 acc. vs text |",
             "|---|---|---|---|---|---|---|---|"]
    for key in keys:
        errs, worst, agree, ll, acc, rf = [], [], [], [], [], []
        for name, d in docs.items():
            r = d["runs"].get(key)
            dn = d["runs"].get(("dense", 1.0))
            if r is None or dn is None:
                continue
            le = [x for x in r["layer_err"] if x is not None]
            if le:
                errs.append(np.mean(le))
                worst.append(np.max(le))
            agree.extend(np.array(r["preds"]) == np.array(dn["preds"]))
            ll.extend(r["logps"])
            acc.extend(np.array(r["preds"]) == np.array(r["targets"]))
            rf.append(r["read_fraction"])
        if not ll:
            continue
        agg[key] = dict(err=np.mean(errs) if errs else 0.0, agree=np.mean(agree), ll=np.mean(ll))
        lines.append("| %s | %s | %.3f | %s | %s | %.3f | %.3f | %.3f |" % (
            LABEL[key[0]], "1x" if key[0] == "dense" else "%gx" % key[1], np.mean(rf),
            "%.4f" % np.mean(errs) if errs else "0", "%.4f" % np.max(worst) if worst else "0",
            np.mean(agree), np.mean(ll), np.mean(acc)))
    main_table = "\n".join(lines)

    if pre:
        # Another model: its document table and main table only, next to SmolLM2's.
        with open(os.path.join(RESULTS, pre + "tables.md"), "w") as f:
            f.write("<!-- doc_table -->\n%s\n\n<!-- main_table -->\n%s\n" % (doc_table, main_table))
        print(open(os.path.join(RESULTS, pre + "tables.md")).read())
        return

    # per-layer error at 20x
    layer_lines = []
    if docs:
        L = None
        per = {}
        for m in common.METHODS[1:]:
            rows = [np.array([np.nan if x is None else x for x in d["runs"][(m, 20.0)]["layer_err"]])
                    for d in docs.values() if (m, 20.0) in d["runs"]]
            if rows:
                per[m] = np.nanmean(np.stack(rows), 0)
                L = len(per[m])
        if L:
            groups = [(0, 1), (1, 2), (2, 5), (5, 10), (10, 20), (20, 30)]
            layer_lines.append("| method (20x) | " + " | ".join("layers %d-%d" % (a, b - 1) if b - a > 1
                                                                  else "layer %d" % a for a, b in groups) + " |")
            layer_lines.append("|---" * (len(groups) + 1) + "|")
            for m, v in per.items():
                layer_lines.append("| %s | " % LABEL[m] + " | ".join("%.4f" % np.nanmean(v[a:b]) for a, b in groups)
                                   + " |")
    layer_table = "\n".join(layer_lines)

    # passkey
    pk = {}
    pk_meta = {}
    for f in sorted(glob.glob(os.path.join(RESULTS, "passkey-*.json"))):
        d = json.load(open(f))
        pk_meta.setdefault(d["length"], []).append(d)
        for r in d["runs"]:
            pk.setdefault((d["length"], r["method"], r["sparsity"]), []).append(bool(r["correct"]))
    pk_lines = []
    lengths = sorted(pk_meta)
    if lengths:
        hdr = "| method | sparsity | " + " | ".join(
            "%d tokens (sink+local %d+%d)" % (max(x["context"] for x in pk_meta[n]), pk_meta[n][0]["sink"],
                                              pk_meta[n][0]["local"]) for n in lengths) + " |"
        pk_lines.append(hdr)
        pk_lines.append("|---|---|" + "---|" * len(lengths))
        for m, sp in keys:
            cells = []
            for n in lengths:
                v = pk.get((n, m, sp))
                cells.append("%d/%d" % (sum(v), len(v)) if v else "-")
            pk_lines.append("| %s | %s | %s |" % (LABEL[m], "1x" if m == "dense" else "%gx" % sp, " | ".join(cells)))
        trials = []
        for n in lengths:
            for d in sorted(pk_meta[n], key=lambda x: x["trial"]):
                dn = [r for r in d["runs"] if r["method"] == "dense"][0]
                trials.append("length %d trial %d: key %d at depth %.2f, dense answer %r" % (
                    n, d["trial"], d["key"], d["depth"], dn["answer"]))
    pk_table = "\n".join(pk_lines)

    # plot
    if agg:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
        for m in common.METHODS[1:]:
            xs = [s for s in common.SPARSITIES if (m, float(s)) in agg]
            if not xs:
                continue
            ax[0].plot(xs, [agg[(m, float(s))]["err"] for s in xs], marker="o", label=LABEL[m])
            ax[1].plot(xs, [agg[(m, float(s))]["agree"] for s in xs], marker="o", label=LABEL[m])
        ax[0].set_xscale("log")
        ax[0].set_yscale("log")
        ax[0].set_xticks(common.SPARSITIES)
        ax[0].set_xticklabels(["%dx" % s for s in common.SPARSITIES])
        ax[0].set_xlabel("sparsity (N / rows read per head)")
        ax[0].set_ylabel("relative L2 error of attention output vs DENSE")
        ax[0].set_title("SmolLM2-135M, %d documents, mean over 30 layers" % len(docs))
        ax[1].set_xscale("log")
        ax[1].set_xticks(common.SPARSITIES)
        ax[1].set_xticklabels(["%dx" % s for s in common.SPARSITIES])
        ax[1].set_xlabel("sparsity")
        ax[1].set_ylabel("next-token agreement with DENSE decode")
        ax[1].set_title("teacher-forced continuation")
        for a in ax:
            a.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax[0].legend(fontsize=8)
        ax[0].grid(alpha=0.3, which="both")
        ax[1].grid(alpha=0.3, which="both")
        fig.tight_layout()
        os.makedirs(os.path.join(ROOT, "docs"), exist_ok=True)
        fig.savefig(os.path.join(ROOT, "docs", "fidelity_error.png"), dpi=110)

    out = dict(doc_table=doc_table, main_table=main_table, layer_table=layer_table, pk_table=pk_table,
               pk_trials="\n".join("- " + t for t in trials) if lengths else "",
               errtarget_table=errtarget_table(docs))
    with open(os.path.join(RESULTS, "tables.md"), "w") as f:
        for k, v in out.items():
            f.write("<!-- %s -->\n%s\n\n" % (k, v))
    print(open(os.path.join(RESULTS, "tables.md")).read())


# ------------------------------------------------------------------------ check

def cmd_check(args):
    """DENSE decode through libssa against numpy attention over the same K/V: a
    short prefill, then `steps` greedy decode steps; per global layer the relative
    L2 error of libssa's output, and the logits against an all-numpy run."""
    model = common.load_model(args.model)
    text = open(documents()["gpl3"], encoding="utf-8").read()
    ids = encode_doc(model, text)[: args.context]
    logits0, K, V = model.prefill(ids)
    rt = common.runtime()
    s = common.build_session(rt, model, K, V)
    layers = common.ssa_layers(model)
    local = common.local_windows(model, K, V)
    ref_K = {l: K[l] for l in layers}
    ref_V = {l: V[l] for l in layers}
    errs = []

    def attend(layer, q, k, v):
        if layer in local:
            Kl, Vl = local[layer]
            Kl = np.concatenate([Kl, k[None]], 0)[-model.window:]
            Vl = np.concatenate([Vl, v[None]], 0)[-model.window:]
            local[layer] = (Kl, Vl)
            return common.dense_attention(q, Kl, Vl)
        sl = layers.index(layer)
        s.append(sl, k[None].astype(np.float32), v[None].astype(np.float32))
        out = s.decode(sl, np.ascontiguousarray(q, dtype=np.float32), method="dense")
        ref_K[layer] = np.concatenate([ref_K[layer], k[None]], 0)
        ref_V[layer] = np.concatenate([ref_V[layer], v[None]], 0)
        ref = common.dense_attention(q.astype(np.float64), ref_K[layer].astype(np.float64),
                                     ref_V[layer].astype(np.float64))
        errs.append(float(np.max(np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1))))
        return out

    ref_cache = NumpyCache(model, K, V)
    a, b = logits0, logits0
    pos = len(ids)
    for _ in range(args.steps):
        t = int(np.argmax(a))
        a = model.step(t, pos, attend)
        b = model.step(t, pos, ref_cache)
        pos += 1
    print("%s: context %d, %d steps, libssa layers %s" % (args.model, len(ids), args.steps, layers))
    print("DENSE via libssa vs numpy float64 attention: max rel. L2 error %.2e (mean %.2e) over %d layer decodes"
          % (max(errs), np.mean(errs), len(errs)))
    print("last logits vs all-numpy decode: rel. L2 error %.2e, argmax %d vs %d" % (
        np.linalg.norm(a - b) / np.linalg.norm(b), int(np.argmax(a)), int(np.argmax(b))))
    s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doc")
    d.add_argument("--doc", choices=sorted(documents()), required=True)
    d.add_argument("--methods", nargs="+", default=common.METHODS, choices=common.METHODS)
    d.add_argument("--steps", type=int, default=32)
    d.add_argument("--sparsities", nargs="+", type=float, default=None, help="default: %s" % common.SPARSITIES)
    d.add_argument("--max-context", type=int, default=8000)
    d.add_argument("--ref-every", type=int, default=2, help="dense reference every k-th step for the error")
    p = sub.add_parser("passkey")
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--trial", type=int, required=True)
    p.add_argument("--methods", nargs="+", default=common.METHODS, choices=common.METHODS)
    e = sub.add_parser("errtarget")
    e.add_argument("--doc", choices=sorted(documents()), required=True)
    e.add_argument("--method", default="ssa", choices=["ssa", "ssa_adaptive"])
    e.add_argument("--eps", nargs="+", type=float, default=[0.02, 0.05, 0.1, 0.2])
    e.add_argument("--delta", type=float, default=0.1)
    e.add_argument("--steps", type=int, default=32)
    e.add_argument("--max-context", type=int, default=8000)
    e.add_argument("--ref-every", type=int, default=2, help="dense reference every k-th step for the error")
    rp = sub.add_parser("report")
    c = sub.add_parser("check")
    c.add_argument("--context", type=int, default=2000)
    c.add_argument("--steps", type=int, default=4)
    for x in (d, e, rp, c):
        x.add_argument("--model", default="smollm2", choices=common.MODELS)
    args = ap.parse_args()
    {"doc": cmd_doc, "passkey": cmd_passkey, "errtarget": cmd_errtarget, "report": cmd_report,
     "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
