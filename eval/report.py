"""Tables from eval/results/*.json (written by eval/fidelity.py) into
eval/results/tables.md: documents (attention error, agreement, log-likelihood),
RULER tasks (accuracy with trials and 95% Wilson intervals, attention error),
per-layer errors and the PQ proxy's quality."""
from __future__ import annotations

import glob
import json
import os
from collections import defaultdict

import numpy as np

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
LABEL = {"dense": "DENSE", "pq_topk": "PQ_TOPK", "oracle_topk": "ORACLE_TOPK",
         "hybrid_uniform": "HYBRID_UNIFORM", "ssa": "SSA", "ssa_adaptive": "SSA_ADAPTIVE"}
MODEL_LABEL = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma-3-270M"}


def load(kind):
    out = []
    for f in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        d = json.load(open(f))
        if d.get("kind") == kind:
            d["_file"] = os.path.basename(f)
            out.append(d)
    return out


def keys():
    return harness.configs(harness.METHODS, harness.SPARSITIES)


def sp_label(m, sp):
    return "1x" if m == "dense" else "%gx" % sp


def doc_tables(docs):
    lines = []
    by = defaultdict(list)
    for d in docs:
        if "-sl" in d["_file"]:
            continue
        by[(d["meta"]["model"], d["length"])].append(d)
    for (model, L), ds in sorted(by.items(), key=lambda x: (x[0][0] != "smollm2", x[0][1])):
        lines.append("### %s, %d-token window (context %s), documents: %s\n" % (
            MODEL_LABEL[model], L, "/".join(str(d["context"]) for d in ds), ", ".join(d["doc"] for d in ds)))
        lines.append("| method | sparsity | rows read / N | attn rel. L2 err (mean over libssa layers) | worst layer "
                     "| top-1 agreement with DENSE | mean log-lik. (nats) | predictions |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for m, sp in keys():
            err, worst, agree, ll, rf = [], [], [], [], []
            for d in ds:
                runs = {(r["method"], r["sparsity"]): r for r in d["runs"]}
                r, dn = runs.get((m, sp)), runs.get(("dense", 1.0))
                if r is None or dn is None:
                    continue
                le = list(r["layer_err"].values())
                err.append(np.mean(le) if le else 0.0)
                worst.append(max(le) if le else 0.0)
                agree.extend(np.array(r["preds"]) == np.array(dn["preds"]))
                ll.extend(r["logps"])
                rf.append(r["read_fraction"])
            if not ll:
                continue
            lines.append("| %s | %s | %.4f | %.4f | %.4f | %.3f | %.3f | %d |" % (
                LABEL[m], sp_label(m, sp), np.mean(rf), np.mean(err), np.mean(worst), np.mean(agree), np.mean(ll),
                len(ll)))
        lines.append("")
        # per-layer error at each sparsity, for the libssa layers
        layers = sorted({int(l) for d in ds for r in d["runs"] for l in r["layer_err"]})
        if len(layers) <= 6 and layers:
            lines.append("Per libssa layer, attention error (mean over documents and steps):\n")
            lines.append("| method | sparsity | " + " | ".join("layer %d" % l for l in layers) + " |")
            lines.append("|---|---|" + "---|" * len(layers))
            for m, sp in keys():
                if m == "dense":
                    continue
                cells = []
                for l in layers:
                    v = [d_r["layer_err"][str(l)] for d in ds for d_r in d["runs"]
                         if (d_r["method"], d_r["sparsity"]) == (m, sp) and str(l) in d_r["layer_err"]]
                    cells.append("%.4f" % np.mean(v) if v else "-")
                lines.append("| %s | %s | %s |" % (LABEL[m], sp_label(m, sp), " | ".join(cells)))
            lines.append("")
    return "\n".join(lines)


def ablation_table(docs):
    ab = [d for d in docs if "-sl" in d["_file"]]
    if not ab:
        return ""
    lines = ["| model | document | context | sink+local | method | sparsity | rows read / N | attn err | "
             "top-1 agreement with DENSE | mean log-lik. |", "|---|---|---|---|---|---|---|---|---|---|"]
    for d in ab:
        base = [x for x in docs if x["doc"] == d["doc"] and x["length"] == d["length"] and "-sl" not in x["_file"]
                and x["meta"]["model"] == d["meta"]["model"]]
        dn = None
        if base:
            dn = {(r["method"], r["sparsity"]): r for r in base[0]["runs"]}.get(("dense", 1.0))
        for r in d["runs"]:
            ag = "%.3f" % np.mean(np.array(r["preds"]) == np.array(dn["preds"])) if dn else "-"
            lines.append("| %s | %s | %d | %d+%d | %s | %s | %.4f | %.4f | %s | %.3f |" % (
                d["meta"]["model"], d["doc"], d["context"], d["sink"], d["local"], LABEL[r["method"]],
                sp_label(r["method"], r["sparsity"]), r["read_fraction"], r["err_mean"], ag, np.mean(r["logps"])))
    return "\n".join(lines)


def ruler_tables(rs):
    lines = []
    by = defaultdict(list)
    for d in rs:
        by[(d["meta"]["model"], d["length"])].append(d)
    for (model, L), ds in sorted(by.items(), key=lambda x: (x[0][0] != "smollm2", x[0][1])):
        tasks = sorted({d["task"] for d in ds})
        ctx = sorted({d["context"] for d in ds})
        lines.append("### %s, %d tokens (prefix %d-%d tokens + question)\n" % (MODEL_LABEL[model], L, ctx[0], ctx[-1]))
        n_ctx = {t: len([d for d in ds if d["task"] == t]) for t in tasks}
        lines.append("Trials: " + ", ".join("%s %d (from %d context%s)" % (
            t, sum(len(d["questions"]) for d in ds if d["task"] == t), n_ctx[t], "s" if n_ctx[t] > 1 else "")
            for t in tasks) + ".\n")
        lines.append("| method | sparsity | " + " | ".join(tasks) + " | all tasks | attn err (mean) | rows read / N |")
        lines.append("|---|---|" + "---|" * (len(tasks) + 3))
        for m, sp in keys():
            cells, K, Nn, errs, rf = [], 0, 0, [], []
            for t in tasks:
                k = n = 0
                for d in ds:
                    if d["task"] != t:
                        continue
                    for q in d["questions"]:
                        for r in q["runs"]:
                            if (r["method"], r["sparsity"]) == (m, sp):
                                k += bool(r["correct"])
                                n += 1
                                errs.append(r["err_mean"])
                                rf.append(r["read_fraction"])
                if n:
                    lo, hi = harness.wilson(k, n)
                    cells.append("%d/%d [%.2f, %.2f]" % (k, n, lo, hi))
                else:
                    cells.append("-")
                K += k
                Nn += n
            if Nn == 0:
                continue
            lo, hi = harness.wilson(K, Nn)
            lines.append("| %s | %s | %s | %d/%d [%.2f, %.2f] | %.4f | %.4f |" % (
                LABEL[m], sp_label(m, sp), " | ".join(cells), K, Nn, lo, hi, np.mean(errs), np.mean(rf)))
        lines.append("")
        dense_ans = []
        for d in ds:
            for q in d["questions"]:
                dn = [r for r in q["runs"] if r["method"] == "dense"]
                if dn:
                    dense_ans.append("%s seed %d, expected %s: DENSE answered %r" % (
                        d["task"], d["seed"], "/".join(q["answers"]), dn[0]["answer"].strip()[:80]))
        lines.append("<details><summary>DENSE answers</summary>\n\n" + "\n".join("- " + a for a in dense_ans)
                     + "\n</details>\n")
    return "\n".join(lines)


def proxy_table(ps):
    if not ps:
        return ""
    lines = []
    for d in ps:
        fr = sorted({f for l in d["layers"].values() for f in l["by_fraction"]}, key=float, reverse=True)
        lines.append("%s, %s, context %d, %d decode steps x %d query heads per layer, sink+local %d+%d:\n" % (
            MODEL_LABEL[d["meta"]["model"]], d["doc"], d["context"], d["steps"], d["meta"]["q_heads"],
            d["sink"], d["local"]))
        lines.append("| layer | sink+local softmax mass | " + " | ".join(
            "k'=%g of candidates: recall / oracle mass / PQ mass" % float(f) for f in fr) + " |")
        lines.append("|---|---|" + "---|" * len(fr))
        for l, v in sorted(d["layers"].items(), key=lambda x: int(x[0])):
            cells = ["%.3f / %.3f / %.3f" % (v["by_fraction"][f]["recall"], v["by_fraction"][f]["mass_oracle"],
                                              v["by_fraction"][f]["mass_pq"]) for f in fr]
            lines.append("| %s | %.3f | %s |" % (l, v["sink_local_mass"], " | ".join(cells)))
        lines.append("")
    return "\n".join(lines)


def main():
    docs, rs, ps = load("doc"), load("ruler"), load("proxy")
    out = [("documents", doc_tables(docs)), ("sink_local_ablation", ablation_table(docs)),
           ("ruler", ruler_tables(rs)), ("proxy", proxy_table(ps))]
    with open(os.path.join(RESULTS, "tables.md"), "w") as f:
        for k, v in out:
            f.write("<!-- %s -->\n%s\n\n" % (k, v))
    print(open(os.path.join(RESULTS, "tables.md")).read())
    import report_groups
    report_groups.main()
