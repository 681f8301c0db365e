"""Tables of group selection against per-head selection at equal rows read
(eval/results/*-groups.json, written by `eval/fidelity.py doc|ruler --groups`)
into eval/results/group_tables.md: per method and sparsity, each selection's
distinct rows read per KV head, attention error (mean and worst query head),
top-1 agreement with DENSE and log-likelihood (documents), RULER accuracy."""
from __future__ import annotations

import os
from collections import defaultdict

import numpy as np

import harness
from report import LABEL, MODEL_LABEL, RESULTS, load

SELECTION = {"off": "per-head", "mixture": "group mixture", "mean_query": "group mean-q"}


def _keys(ds, runs_of):
    seen = []
    for d in ds:
        for r in runs_of(d):
            k = (r["method"], r["sparsity"], r.get("group_selection", "off"))
            if k not in seen:
                seen.append(k)
    order = {m: i for i, m in enumerate(harness.METHODS)}
    return sorted(seen, key=lambda k: (order[k[0]], k[1], harness.GROUPS.index(k[2])))


def _worst_head(r):
    return max((max(v) for v in r.get("head_err", {}).values()), default=0.0)


def doc_tables(docs):
    lines = []
    by = defaultdict(list)
    for d in docs:
        by[(d["meta"]["model"], d["length"])].append(d)
    for (model, L), ds in sorted(by.items(), key=lambda x: (x[0][0] != "smollm2", x[0][1])):
        lines.append("### %s, %d-token window (context %s), documents: %s, %s steps\n" % (
            MODEL_LABEL[model], L, "/".join(str(d["context"]) for d in ds), ", ".join(d["doc"] for d in ds),
            "/".join(str(d["steps"]) for d in ds)))
        lines.append("| method | sparsity | selection | distinct rows per KV head / N | attn err (mean) | worst layer "
                     "| worst head | top-1 agreement with DENSE | mean log-lik. (nats) | predictions |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for m, sp, g in _keys(ds, lambda d: d["runs"]):
            err, worst, wh, agree, ll, df = [], [], [], [], [], []
            for d in ds:
                runs = {(r["method"], r["sparsity"], r.get("group_selection", "off")): r for r in d["runs"]}
                r, dn = runs.get((m, sp, g)), runs.get(("dense", 1.0, "off"))
                if r is None or dn is None:
                    continue
                le = list(r["layer_err"].values())
                err.append(np.mean(le) if le else 0.0)
                worst.append(max(le) if le else 0.0)
                wh.append(_worst_head(r))
                agree.extend(np.array(r["preds"]) == np.array(dn["preds"]))
                ll.extend(r["logps"])
                df.append(r["distinct_fraction"] if r.get("distinct_fraction") is not None else r["read_fraction"])
            if not ll:
                continue
            lines.append("| %s | %s | %s | %.4f | %.4f | %.4f | %.4f | %.3f | %.3f | %d |" % (
                LABEL[m], "1x" if m == "dense" else "%gx" % sp, SELECTION[g], np.mean(df), np.mean(err),
                np.mean(worst), np.mean(wh), np.mean(agree), np.mean(ll), len(ll)))
        lines.append("")
    return "\n".join(lines)


def paired_ll_table(docs):
    """Log-likelihood of each group selection minus per-head selection's, paired over
    the same predicted tokens: mean +- standard error (nats per token)."""
    lines = ["| model | document | method | selection | 10x | 20x | 50x |", "|---|---|---|---|---|---|---|"]
    for d in sorted(docs, key=lambda d: (d["meta"]["model"] != "smollm2", d["length"], d["doc"])):
        runs = {(r["method"], r["sparsity"], r.get("group_selection", "off")): r for r in d["runs"]}
        for m in harness.METHODS:
            for g in harness.GROUPS[1:]:
                cells = []
                for sp in harness.SPARSITIES:
                    r, ph = runs.get((m, sp, g)), runs.get((m, sp, "off"))
                    if r is None or ph is None:
                        cells.append("-")
                        continue
                    dl = np.array(r["logps"]) - np.array(ph["logps"])
                    cells.append("%+.3f +- %.3f" % (dl.mean(), dl.std(ddof=1) / np.sqrt(len(dl))))
                if any(c != "-" for c in cells):
                    lines.append("| %s | %s | %s | %s | %s |" % (MODEL_LABEL[d["meta"]["model"]], d["doc"], LABEL[m],
                                                             SELECTION[g], " | ".join(cells)))
    return "\n".join(lines) + "\n"


def ruler_tables(rs):
    lines = []
    by = defaultdict(list)
    for d in rs:
        by[(d["meta"]["model"], d["length"])].append(d)
    for (model, L), ds in sorted(by.items(), key=lambda x: (x[0][0] != "smollm2", x[0][1])):
        trials = ", ".join("%s seed %d: %d question(s)" % (d["task"], d["seed"], len(d["questions"])) for d in ds)
        lines.append("### %s, %d tokens (%s)\n" % (MODEL_LABEL[model], L, trials))
        lines.append("| method | sparsity | selection | correct / trials [95%] | attn err (mean) | worst head "
                     "| distinct rows per KV head / N |")
        lines.append("|---|---|---|---|---|---|---|")
        for m, sp, g in _keys(ds, lambda d: [r for q in d["questions"] for r in q["runs"]]):
            k = n = 0
            errs, wh, df = [], [], []
            for d in ds:
                for q in d["questions"]:
                    for r in q["runs"]:
                        if (r["method"], r["sparsity"], r.get("group_selection", "off")) == (m, sp, g):
                            k += bool(r["correct"])
                            n += 1
                            errs.append(r["err_mean"])
                            wh.append(_worst_head(r))
                            df.append(r["distinct_fraction"] if r.get("distinct_fraction") is not None
                                      else r["read_fraction"])
            if not n:
                continue
            lo, hi = harness.wilson(k, n)
            lines.append("| %s | %s | %s | %d/%d [%.2f, %.2f] | %.4f | %.4f | %.4f |" % (
                LABEL[m], "1x" if m == "dense" else "%gx" % sp, SELECTION[g], k, n, lo, hi, np.mean(errs),
                np.mean(wh), np.mean(df)))
        lines.append("")
    return "\n".join(lines)


def main():
    docs = load("group_doc")
    text = "<!-- documents -->\n%s\n\n<!-- paired log-likelihood -->\n%s\n<!-- ruler -->\n%s\n" % (
        doc_tables(docs), paired_ll_table(docs), ruler_tables(load("group_ruler")))
    with open(os.path.join(RESULTS, "group_tables.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    print(main())
