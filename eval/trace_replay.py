#!/usr/bin/env python3
"""Replays selection traces (eval/trace_log.py files, written by
`eval/fidelity.py ... --traces DIR`) to measure how the selected rows move from
one decode step to the next, and how a device cache of recently read rows would
serve them.

  python3 eval/trace_replay.py DIR_OR_FILES... [--fractions 0.02 0.05 0.1 0.2 0.5 1]
                               [--pages 256 64] [--out eval/results/trace_replay.md]

Step-to-step overlap, per (layer, query head), between consecutive decodes A
(step t-1) and B (step t): Jaccard |A & B| / |A | B|, and the fraction of step
t's rows already read at step t-1, |A & B| / |B|; means over all pairs. "all"
counts every row a head read; "middle" leaves out the sink and local rows
(always read, the local window slides by one), i.e. the selected rows only.

Cache: one LRU cache for the whole model, fed with the rows in the order the
decode reads them (step by step, layer by layer, KV head by KV head, ascending
tokens). A KV row is read once per decode for its KV group (the union of the
group's query heads' rows). At row granularity an entry is one K/V row of one
KV head of one layer; at page granularity (page_tokens P) an entry is one page
of one layer (all its KV heads, as libssa stores them), touched when any row in
it is read. Capacity is a fraction of the context: f * N * n_kv * n_layers rows,
or f * ceil(N / P) * n_layers pages, N the context at the trace's first decode.
Hit rate: hits / accesses over every step after the first (the first fills the
cache). "middle": only the selected middle rows go through the cache (sink and
local rows pinned elsewhere).
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
from collections import OrderedDict, defaultdict
from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_log  # noqa: E402

FRACTIONS = [0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
PAGES = [256, 64]


def segments(d: Dict):
    """(position, layer, head, context, rows) per traced head decode."""
    tok, off = d["tokens"], d["offsets"]
    for i in range(len(d["position"])):
        yield (int(d["position"][i]), int(d["layer"][i]), int(d["head"][i]), int(d["context"][i]),
               tok[int(off[i]):int(off[i + 1])])


def middle(rows: np.ndarray, context: int, n_sink: int, n_local: int) -> np.ndarray:
    return rows[(rows >= n_sink) & (rows < context - n_local)]


def _rows(d: Dict, rows: np.ndarray, context: int, middle_only: bool) -> np.ndarray:
    m = d["meta"]
    return middle(rows, context, m["n_sink"], m["n_local"]) if middle_only else rows


def step_overlap(d: Dict, middle_only: bool = False) -> Dict:
    """Mean Jaccard and mean fraction of step t's rows read at step t-1, over
    consecutive decodes of every (layer, query head)."""
    by: Dict[Tuple[int, int], List[Tuple[int, np.ndarray]]] = defaultdict(list)
    for pos, layer, head, ctx, rows in segments(d):
        by[(layer, head)].append((pos, _rows(d, rows, ctx, middle_only)))
    jac, prev = [], []
    for seq in by.values():
        seq.sort(key=lambda x: x[0])
        for (_, a), (_, b) in zip(seq, seq[1:]):
            inter = np.intersect1d(a, b, assume_unique=True).size
            union = a.size + b.size - inter
            if union:
                jac.append(inter / union)
            if b.size:
                prev.append(inter / b.size)
    return dict(jaccard=float(np.mean(jac)) if jac else float("nan"),
                prev_fraction=float(np.mean(prev)) if prev else float("nan"), pairs=len(prev))


def access_steps(d: Dict, page_tokens: int = 0, middle_only: bool = False) -> List[List[int]]:
    """The cache accesses of each decode step, in read order. page_tokens 0: rows
    (key: layer, KV head, token); else pages (key: layer, page)."""
    m = d["meta"]
    g = m["n_q_heads"] // m["n_kv_heads"]
    # (position, layer, kv) -> union of the group's rows
    groups: Dict[Tuple[int, int, int], List[np.ndarray]] = defaultdict(list)
    for pos, layer, head, ctx, rows in segments(d):
        groups[(pos, layer, head // g)].append(_rows(d, rows, ctx, middle_only))
    steps: Dict[int, List[int]] = defaultdict(list)
    layer_pages: Dict[Tuple[int, int], set] = {}
    for (pos, layer, kv) in sorted(groups):
        rows = np.unique(np.concatenate(groups[(pos, layer, kv)]))
        if page_tokens:
            layer_pages.setdefault((pos, layer), set()).update((rows // page_tokens).tolist())
        else:
            steps[pos].extend((((layer * m["n_kv_heads"] + kv) << 32) | rows.astype(np.int64)).tolist())
    if page_tokens:
        for (pos, layer) in sorted(layer_pages):
            steps[pos].extend((layer << 32) | p for p in sorted(layer_pages[(pos, layer)]))
    return [steps[p] for p in sorted(steps)]


def lru_hit_rate(steps: Sequence[Sequence[int]], capacity: int, skip_first: int = 1) -> float:
    """Hits / accesses of an LRU cache of `capacity` entries over steps[skip_first:]
    (every access inserts or refreshes its entry; the least recently used goes)."""
    cache: "OrderedDict[int, None]" = OrderedDict()
    hits = total = 0
    for i, step in enumerate(steps):
        count = i >= skip_first
        for key in step:
            if key in cache:
                cache.move_to_end(key)
                hits += count
            else:
                cache[key] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
            total += count
    return hits / total if total else float("nan")


def replay(d: Dict, fractions: Sequence[float] = FRACTIONS, pages: Sequence[int] = PAGES) -> Dict:
    m = d["meta"]
    n0 = int(d["context"][0])
    layers = len(set(d["layer"].tolist()))
    out = dict(meta=m, context=n0, layers=layers, steps=len(set(d["position"].tolist())),
               overlap={k: step_overlap(d, k == "middle") for k in ("all", "middle")}, cache={})
    for part in ("all", "middle"):
        mid = part == "middle"
        for P in [0] + list(pages):
            steps = access_steps(d, P, mid)
            unit = n0 * m["n_kv_heads"] * layers if P == 0 else math.ceil(n0 / P) * layers
            name = "row" if P == 0 else "page%d" % P
            per_step = float(np.mean([len(s) for s in steps])) / unit
            out["cache"][(part, name)] = dict(
                accessed_fraction=per_step,
                hit={f: lru_hit_rate(steps, max(1, int(round(f * unit)))) for f in fractions})
    return out


def files_of(paths: Iterable[str]) -> List[str]:
    out = []
    for p in paths:
        out.extend(sorted(glob.glob(os.path.join(p, "*.npz"))) if os.path.isdir(p) else [p])
    return out


def markdown(results: List[Tuple[str, Dict]], fractions: Sequence[float]) -> str:
    lines = ["### Step-to-step overlap of the selected rows (mean over layers, query heads, steps)\n",
             "| trace | method | sparsity | selection | context | steps | Jaccard (all) | prev. step (all) | "
             "Jaccard (middle) | prev. step (middle) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for f, r in results:
        m, o = r["meta"], r["overlap"]
        lines.append("| %s | %s | %gx | %s | %d | %d | %.3f | %.3f | %.3f | %.3f |" % (
            m["piece"], m["method"], m["sparsity"], m["group_selection"], r["context"], r["steps"],
            o["all"]["jaccard"], o["all"]["prev_fraction"], o["middle"]["jaccard"], o["middle"]["prev_fraction"]))
    lines += ["", "### LRU cache hit rate (steps after the first), capacity as a fraction of the context\n",
              "| trace | method | sparsity | selection | rows | unit | read per step / context | " +
              " | ".join("hit @ %g" % f for f in fractions) + " |",
              "|---|---|---|---|---|---|---|" + "---|" * len(fractions)]
    for f, r in results:
        m = r["meta"]
        for (part, unit), c in r["cache"].items():
            lines.append("| %s | %s | %gx | %s | %s | %s | %.4f | %s |" % (
                m["piece"], m["method"], m["sparsity"], m["group_selection"], part, unit, c["accessed_fraction"],
                " | ".join("%.3f" % c["hit"][x] for x in fractions)))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="trace files (.npz) or folders of them")
    ap.add_argument("--fractions", nargs="+", type=float, default=FRACTIONS)
    ap.add_argument("--pages", nargs="+", type=int, default=PAGES)
    ap.add_argument("--out", default=None, help="also write the tables (markdown) here")
    args = ap.parse_args()
    results = []
    for f in files_of(args.paths):
        results.append((os.path.basename(f), replay(trace_log.load(f), args.fractions, args.pages)))
        print("replayed %s" % f, file=sys.stderr, flush=True)
    text = markdown(results, args.fractions)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("<!-- python3 eval/trace_replay.py %s -->\n%s" % (" ".join(sys.argv[1:]), text))


if __name__ == "__main__":
    main()
