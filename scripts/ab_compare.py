#!/usr/bin/env python3
"""Side-by-side table of a `scripts/gpu.sh ab` run: per case, each variant's decode
time (the best of its rounds, plain and graph replay) and its ratio to the base.

  python3 scripts/ab_compare.py $OUT/ab_bench.log

Reads the '### <variant> round <n>' headers and the '# <config> n=<N> batch=<B>
<method> <S>x: <ms> ms, graph <ms> ms ...' lines gpu_decode_bench prints.
"""
import re
import sys
from collections import defaultdict

HEADER = re.compile(r"^#+ *(\S+) round (\d+)")
CASE = re.compile(r"^# (\S+) n=(\d+) batch=(\d+) (\S+) (\d+)x: ([\d.]+) ms, graph ([\d.]+) ms")


def context(n):
    n = int(n)
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    times = defaultdict(lambda: defaultdict(list))  # case -> variant -> [(ms, graph ms)]
    variants, variant = [], None
    with open(sys.argv[1]) as f:
        for line in f:
            m = HEADER.match(line)
            if m:
                variant = m.group(1)
                if variant not in variants:
                    variants.append(variant)
                continue
            m = CASE.match(line)
            if m and variant:
                cfg, n, batch, method, sparsity, ms, graph = m.groups()
                case = f"{cfg} {context(n)} b{batch} {method} {sparsity}x"
                times[case][variant].append((float(ms), float(graph)))
    if not variants:
        sys.exit("no '### <variant> round <n>' headers in " + sys.argv[1])
    base = variants[0]
    head = ["case"] + [f"{v} ms (graph)" for v in variants] + [f"{v} / {base}" for v in variants[1:]]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for case, by_variant in times.items():
        best = {v: (min(t[0] for t in ts), min(t[1] for t in ts)) for v, ts in by_variant.items()}
        cells = [case]
        for v in variants:
            cells.append(f"{best[v][0]:.3f} ({best[v][1]:.3f})" if v in best else "-")
        for v in variants[1:]:
            ok = v in best and base in best
            cells.append(f"{best[v][0] / best[base][0]:.3f}" if ok else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
