#!/usr/bin/env python3
"""Markdown report of the GPU decode benchmark matrix (standard library only).

Reads the JSON lines printed by bench/gpu_decode_bench and bench/gpu_sdpa_bench.py
(any other line is ignored, so whole logs can be given) and writes: the targets
with measured values, then one table per (config, batch, context) with a row per
method and sparsity, then the errors.

  python3 bench/gpu_bench_report.py LOG [LOG ...] [--out report.md] [--raw]

--raw appends every input line in a fenced block (the report then carries its
own data: it can be given to this script again).
"""
import argparse
import json
import math
import sys

LABEL = {"dense": "ours dense", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN",
         "sdpa_efficient": "SDPA efficient", "flashinfer": "FlashInfer", "pq_topk": "PQ_TOPK", "ssa": "SSA",
         "pq_topk_gmean": "PQ_TOPK group mean-query", "ssa_gmean": "SSA group mean-query",
         "ssa_gmix": "SSA group mixture"}
ORDER = {"dense": 0, "sdpa_flash": 1, "sdpa_cudnn": 2, "sdpa_efficient": 3, "flashinfer": 4, "pq_topk": 10,
         "ssa": 11, "pq_topk_gmean": 12, "ssa_gmean": 13, "ssa_gmix": 14}
DENSE = ("dense", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flashinfer")
CONFIG_ORDER = {"paper": 0, "llama8b": 1}
K128, M1 = 131072, 1048576


def load(paths):
    lines, recs = [], []
    for p in paths:
        with open(p, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                lines.append(line)
                s = line.strip()
                if not s.startswith("{"):
                    continue
                try:
                    r = json.loads(s)
                except ValueError:
                    continue
                if isinstance(r, dict) and "rec" in r:
                    recs.append(r)
    return lines, recs


def num(v):
    """v as a finite float, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def fmt(v, digits=3):
    v = num(v)
    return "n/a" if v is None else f"{v:.{digits}f}"


def ctx(n):
    return f"{n >> 20}M" if n % M1 == 0 else f"{n >> 10}K" if n % 1024 == 0 else str(n)


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def label(r):
    m = r.get("method", "?")
    name = LABEL.get(m, m)
    if m == "ssa" and num(r.get("h")) is not None:
        name += f" h={num(r['h']):g}"
    return name


class Data:
    def __init__(self, recs):
        self.meta = [r for r in recs if r["rec"] == "meta"]
        self.fatal = [r for r in recs if r["rec"] == "fatal"]
        bw = {}
        for r in recs:
            if r["rec"] == "copy_bw" and num(r.get("gbps")):
                bw[r.get("src", "?")] = r
        self.bw_recs = bw
        pick = bw.get("ours") or bw.get("sdpa")
        self.bw = num(pick["gbps"]) if pick else None
        self.bw_src = pick.get("src") if pick else None
        # The last record of each (config, n, batch, method, sparsity) wins.
        self.results, self.errors, self.shape = {}, [], {}
        for r in recs:
            if r["rec"] not in ("result", "error"):
                continue
            if "config" not in r:
                self.errors.append(r)
                continue
            g = (r["config"], int(r.get("batch", 0)), int(r.get("n", 0)))
            self.shape.setdefault(g, r)
            if r["rec"] == "result":
                self.results[g + (r.get("method"), int(r.get("sparsity", 0)))] = r
            else:
                self.errors.append(r)
        # Drop errors that a later result of the same key replaced.
        self.errors = [e for e in self.errors if "config" not in e or
                       (e["config"], int(e.get("batch", 0)), int(e.get("n", 0)), e.get("method"),
                        int(e.get("sparsity", 0))) not in self.results]

    def groups(self):
        return sorted(self.shape, key=lambda g: (CONFIG_ORDER.get(g[0], 9), g[0], g[1], g[2]))

    def get(self, config, batch, n, method, sparsity=0):
        return self.results.get((config, batch, n, method, sparsity))

    def best_dense(self, g):
        best = None
        for m in DENSE:
            r = self.results.get(g + (m, 0))
            if r and num(r.get("ms")):
                if best is None or r["ms"] < best["ms"]:
                    best = r
        return best

    def speedup(self, g, r):
        b = self.best_dense(g)
        if not b or not r or not num(r.get("ms")):
            return None
        return b["ms"] / r["ms"]

    def fastest_dense_set(self, g):
        """The fastest input set of any dense method of case g (ms)."""
        times = [t for m in DENSE for t in seed_times(self.results.get(g + (m, 0)))]
        return min(times) if times else None


def seed_times(r):
    """A record's per-input-set medians (ms), or its one median."""
    if not r:
        return []
    seeds = [num(v) for v in r.get("ms_seeds") or [] if num(v)]
    return seeds or ([num(r["ms"])] if num(r.get("ms")) else [])


def fastest_set(r):
    """A record's fastest input set (ms)."""
    t = seed_times(r)
    return min(t) if t else None


def worst_ratio(fast_ms, slow_r):
    """fast_ms over the slowest input set of slow_r: the ratio if the spread between input sets all went
    against slow_r's method."""
    t = seed_times(slow_r)
    return fast_ms / max(t) if fast_ms and t else None


def describe(r):
    return f"{r.get('config')} ({r.get('nq')} q / {r.get('nkv')} KV / d {r.get('d')} / {r.get('dtype')})"


def targets(data, out):
    out.append("## Targets\n")
    out.append("Status from the medians. 'Worst input set': the same ratio from the fastest input set of the "
               "faster side (the best dense; for the dense row SDPA flash) over the slowest of ours, i.e. as if "
               "the spread between input sets had all gone against us.\n")
    out.append("| target | case | measured | worst input set | needed | status |")
    out.append("|---|---|---|---|---|---|")

    def row(what, case, value, unit, needed, ok, worst=None):
        w = f"{worst:.3f}{unit}" if worst is not None else ""
        if value is None:
            out.append(f"| {what} | {case} | no data | {w} | {needed} | no data |")
        else:
            out.append(f"| {what} | {case} | {value:.3f}{unit} | {w} | {needed} | {'met' if ok(value) else 'missed'} |")

    configs = sorted({g[0] for g in data.shape}, key=lambda c: (CONFIG_ORDER.get(c, 9), c)) or ["paper"]
    for n, batch, need in ((M1, 1, 5.0), (M1, 16, 6.0), (K128, 1, 1.5)):
        for c in configs:
            g = (c, batch, n)
            r = data.get(c, batch, n, "ssa", 50)
            b = data.best_dense(g)
            case = f"{c} {ctx(n)} batch {batch}" + (f" (vs {LABEL.get(b['method'], b['method'])})" if b else "")
            row(f"SSA 50x speed-up over the best dense", case, data.speedup(g, r), "x", f">= {need:g}x",
                lambda v, need=need: v >= need, worst_ratio(data.fastest_dense_set(g), r))
            gm = num(r.get("ms_graph")) if r else None
            row(f"same, SSA replayed from a CUDA graph", case, b["ms"] / gm if b and gm else None, "x",
                f">= {need:g}x", lambda v, need=need: v >= need)
    for g in data.groups():
        d, f = data.get(*g, "dense"), data.get(*g, "sdpa_flash")
        v = f["ms"] / d["ms"] if d and f and num(d.get("ms")) and num(f.get("ms")) else None
        row("ours dense throughput / SDPA flash", f"{g[0]} {ctx(g[2])} batch {g[1]}", v, "x", ">= 0.95x",
            lambda v: v >= 0.95, worst_ratio(fastest_set(f), d))
    r = data.get("paper", 1, M1, "ssa", 50)
    st = r.get("stages") if r else None
    row("SSA sampling stage (h=0.4, 50x)", "paper 1M batch 1", num(st.get("sample")) if st else None, " ms",
        "<= 0.1 ms", lambda v: v <= 0.1)
    out.append("")


def versus_flashinfer(data, out):
    """SSA 50x against FlashInfer's batch decode, the baseline of the paper's kernel
    numbers (not a target here: the targets use the best dense baseline)."""
    if not any(k[3] == "flashinfer" for k in data.results):
        return
    out.append("## SSA 50x against FlashInfer (the paper's baseline)\n")
    out.append("The paper's kernel: 1.79x at 1M batch 1, 2.96x at batch 16, 0.60-0.74x at 128K.\n")
    out.append("| case | FlashInfer ms | SSA 50x ms | SSA / FlashInfer speed-up |")
    out.append("|---|---|---|---|")
    for g in data.groups():
        f, r = data.get(*g, "flashinfer"), data.get(*g, "ssa", 50)
        if f and r and num(f.get("ms")) and num(r.get("ms")):
            out.append(f"| {g[0]} {ctx(g[2])} batch {g[1]} | {fmt(f['ms'])} | {fmt(r['ms'])} | "
                       f"{f['ms'] / r['ms']:.2f}x |")
    out.append("")


def group_table(data, g, out):
    s = data.shape[g]
    out.append(f"### {describe(s)}, batch {g[1]}, context {ctx(g[2])}\n")
    rows = [r for k, r in data.results.items() if k[:3] == g]
    errs = [e for e in data.errors if (e.get("config"), int(e.get("batch", 0)), int(e.get("n", 0))) == g]
    allrows = rows + errs
    allrows.sort(key=lambda r: (int(r.get("sparsity", 0)), ORDER.get(r.get("method"), 20 if r["rec"] == "result"
                                                                       else -1), r["rec"]))
    best = data.best_dense(g)
    out.append("| method | sparsity | k | ms | graph ms | ms per input set | GB/s | x best dense | byte floor ms | "
               "ms / floor | stages ms: score / top-k / sample / lists / attn / merge | splits |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in allrows:
        sp = int(r.get("sparsity", 0))
        spl = "dense" if sp == 0 else f"{sp}x"
        if r["rec"] == "error":
            m = r.get("method", "?")
            name = "all methods" if m == "*" else label(r)
            out.append(f"| {cell(name)} | {spl if m != '*' else ''} | | error: {cell(r.get('error', ''))} "
                       "| | | | | | | | |")
            continue
        ms = num(r.get("ms"))
        seeds = [num(x) for x in r.get("ms_seeds", []) if num(x) is not None and num(x) >= 0]
        seeds_s = f"{min(seeds):.3f}-{max(seeds):.3f} ({len(seeds)})" if seeds else ""
        nbytes = num(r.get("bytes"))
        gbps = nbytes / (ms * 1e6) if nbytes and ms else None
        # Score traffic counts in the floor (records before it was recorded: none).
        floor_bytes = nbytes + (num(r.get("score_bytes")) or 0) if nbytes else None
        floor = floor_bytes / (data.bw * 1e6) if floor_bytes and data.bw else None
        sp_x = best["ms"] / ms if best and ms else None
        st = r.get("stages")
        st_s = " / ".join(fmt(st.get(k)) for k in ("score", "topk", "sample", "lists", "attn", "merge")) if isinstance(st, dict) else ""
        mark = " (best dense)" if best is r else ""
        out.append(f"| {label(r)}{mark} | {spl} | {r.get('k', '')} | {fmt(ms)} | {fmt(num(r.get('ms_graph')))} | {seeds_s} | "
                   f"{fmt(gbps, 0)} | {fmt(sp_x, 2)} | {fmt(floor)} | {fmt(ms / floor if ms and floor else None, 1)} "
                   f"| {st_s} | {r.get('splits', '')} |")
    out.append("")


def report(data, lines, raw):
    out = ["# GPU decode benchmark matrix\n"]
    seen = []
    for m in data.meta:
        if m in seen:  # the same process metadata from a second run (e.g. the FlashInfer process)
            continue
        seen.append(m)
        if m.get("src") == "ours":
            out.append(f"- Device: {m.get('device')} ({m.get('sms')} SMs, L2 {fmt(m.get('l2_mb'), 0)} MB, "
                       f"{fmt(m.get('mem_gb'), 1)} GB), driver {m.get('driver')}, runtime {m.get('runtime')}; "
                       f"kMaxBatchItems {m.get('max_batch_items')} (batch 16 is one launch set).")
        elif m.get("src") == "sdpa":
            out.append(f"- PyTorch {m.get('torch')} (CUDA {m.get('cuda')}, cuDNN {m.get('cudnn')}) on {m.get('device')}.")
        elif m.get("src") == "flashinfer":
            out.append(f"- FlashInfer {m.get('version')}: its batch decode templates compiled into gpu_decode_bench, "
                       f"over the same K/V pages (page 256, HND); each case's output is checked against ours dense.")
        elif m.get("commit"):
            out.append(f"- Commit {m.get('commit')}.")
    for src, r in sorted(data.bw_recs.items()):
        used = " (used for the byte floors)" if src == data.bw_src else ""
        out.append(f"- Copy bandwidth ({src}): {fmt(r.get('gbps'), 0)} GB/s, (read + write) bytes / time of a "
                   f"{num(r.get('bytes')) / 2**30:.0f} GiB device-to-device copy{used}.")
    if data.bw is None:
        out.append("- Copy bandwidth: not measured (no byte floors).")
    out.append("- Times: CUDA events, L2 flushed (256 MiB read) before each timed call, 2 warm-up calls, then "
               "10-100 timed calls (about 100 ms); median per input set (query seed), then the median over the "
               "input sets (their range in 'ms per input set'). Batch 16 = 16 distinct sequences (own K/V pages).")
    out.append("- Budget k = ceil(N / sparsity) tokens per q head (sink 128 + local 128 included); PQ M = 16, "
               "K = 256; page 256 tokens. Bytes: dense = all K and V; sparse = PQ codes of every token once per "
               "KV head + k rows of K and V per q head; GB/s = bytes / time; byte floor = (bytes + score traffic) / "
               "copy bandwidth, where the score traffic of a sparse method is each token's proxy score per q head "
               "written once and read once (8 bytes). "
               "'x best dense' = best dense time (ours, SDPA or FlashInfer, same case) / time. Stages: events between the "
               "stages of one pipeline run (score = init rows + PQ lookup tables + scores, which also counts "
               "the top-k histogram; top-k = filter (which finds the cut from the histogram) and refine, where the filter also sums the residual sampling weights per block and "
               "chunk (SSA, fixed heavy rule); sample = the draws; lists = the heavy "
               "and sample bitmaps compacted into token-ordered lists with log pi; attn = attention of the splits; "
               "merge = the splits' partial results merged into the output). 'graph ms': the same decode replayed from a CUDA graph captured once per input set.")
    out.append("")
    for f in data.fatal:
        out.append(f"**Fatal ({f.get('src')}): {cell(f.get('error', ''))}** (later cases of that program did not run)\n")
    targets(data, out)
    versus_flashinfer(data, out)
    out.append("## Cases\n")
    for g in data.groups():
        group_table(data, g, out)
    other = [e for e in data.errors if "config" not in e]
    if other:
        out.append("## Other errors\n")
        for e in other:
            out.append(f"- {e.get('src')} {e.get('method')}: {cell(e.get('error', ''))}")
        out.append("")
    if raw:
        out.append("## Raw lines\n")
        out.append("```")
        out.extend(l.replace("```", "'''") for l in lines)
        out.append("```")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--raw", action="store_true")
    a = ap.parse_args()
    lines, recs = load(a.logs)
    text = report(Data(recs), lines, a.raw)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
