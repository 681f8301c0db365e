"""Markdown tables from eval/proxy_compare.py results: one summary row per proxy
spec (recall and proxy softmax mass of the top 2/5/10%, the decode errors, the
index training time), then top-2% recall per libssa layer.

Usage: python eval/proxy_tables.py RESULT.json [RESULT.json ...]
Specs measured in several files of the same model, window and observation
steps are listed once each, in the order they appear.
"""
from __future__ import annotations

import json
import sys

NAMES = {"pq": "PQ", "opq": "OPQ", "pq4": "PQ4", "opq4": "OPQ4", "qpq": "QPQ", "qpq4": "QPQ4"}


def label(spec: str) -> str:
    parts = spec.split(":")
    name, sub = parts[0], int(parts[1])
    four = name in ("pq4", "opq4", "qpq4")
    text = "%s %dx%d (%d B)" % (NAMES[name], sub, 16 if four else 256, sub // 2 if four else sub)
    if len(parts) == 3:
        text += ", eta %g" % float(parts[2])
    return text


def three(d, fmt="%.3f"):
    return " / ".join(fmt % d[k] for k in sorted(d, key=float))


def main(paths):
    groups = {}
    for p in paths:
        r = json.load(open(p))
        key = (r["model"], r["context"], r.get("observe", 0))
        g = groups.setdefault(key, dict(steps=r["steps"], sink=r["sink"], specs={}, layers={}))
        for spec, s in r["summary"].items():
            g["specs"].setdefault(spec, s)
        for layer, per in r["layers"].items():
            for spec, v in per.items():
                g["layers"].setdefault(layer, {}).setdefault(spec, v)
    for (model, ctx, observe), g in groups.items():
        n_layers = len(g["layers"])
        print("**%s, context %d, %s%d steps, sink+local %d+%d, %d libssa layers**\n" % (
            model, ctx, "index trained after %d observation steps, then " % observe if observe else "",
            g["steps"], g["sink"], g["sink"], n_layers))
        print("| proxy | recall top 2% / 5% / 10% | recall, float table | proxy mass 2% / 5% / 10% (oracle) "
              "| PQ_TOPK err 10/20/50x | SSA err 10/20/50x | SSA_ADAPTIVE err 10/20/50x | training, s |")
        print("|---|---|---|---|---|---|---|---|")
        for spec, s in g["specs"].items():
            e = s["error"]
            # Runs with --no-errors measured no decode errors.
            err = lambda m: " / ".join("%.3f" % e["%s@%d" % (m, x)] if "%s@%d" % (m, x) in e else "-"  # noqa: E731
                                       for x in (10, 20, 50))
            print("| %s | %s | %s | %s (%s) | %s | %s | %s | %.0f |" % (
                label(spec), three(s["recall"]), three(s["recall_float"]) if "recall_float" in s else "-",
                three(s["mass_proxy"]), three(s["mass_oracle"]), err("pq_topk"), err("ssa"), err("ssa_adaptive"),
                s["train_seconds"]))
        specs = list(g["specs"])
        print("\nTop-2% recall per layer:\n")
        print("| layer | " + " | ".join(label(s) for s in specs) + " |")
        print("|---" * (len(specs) + 1) + "|")
        for layer in sorted(g["layers"], key=int):
            per = g["layers"][layer]
            print("| %s | %s |" % (layer, " | ".join(
                "%.3f" % per[s]["by_fraction"]["0.02"]["recall"] if s in per else "-" for s in specs)))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
