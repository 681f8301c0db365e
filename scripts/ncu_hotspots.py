#!/usr/bin/env python3
"""Where a kernel's warps stall, per SASS instruction and summed per opcode.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass`
(one row per SASS instruction with its warp-stall samples) and prints the
instructions with the most samples, then the samples per opcode and per stall
reason. Used on the GPU machine, where the CSV is too large to bring back:
  ncu --import prof.ncu-rep --page source --csv --print-source sass > src.csv
  python3 scripts/ncu_hotspots.py src.csv [--top 30]
"""
import argparse
import collections
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.strip() and not line.startswith("==")]
    # The table starts at its header row (a "Kernel Name" line comes first).
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0)
    lines = lines[start:]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit("no rows in " + args.csv)
    cols = list(rows[0].keys())
    total_col = next((c for c in cols if c and c.startswith("Warp Stall Sampling (All")), None)
    source_col = next((c for c in cols if c and c.strip() == "Source"), cols[1])
    if total_col is None:
        sys.exit("no warp-stall column; columns: " + ", ".join(cols))
    # Per-reason columns (stall_<reason>), all samples rather than the not-issued ones.
    reason_cols = [c for c in cols if c and c.startswith("stall_") and "Not Issued" not in c]
    total = sum(number(r[total_col]) for r in rows) or 1.0
    print(f"{len(rows)} SASS instructions, {total:.0f} warp-stall samples ({total_col})")
    print(f"\ntop {args.top} instructions:")
    for r in sorted(rows, key=lambda r: -number(r[total_col]))[: args.top]:
        print(f"  {100 * number(r[total_col]) / total:5.1f}%  {r[source_col].strip()}")
    by_op = collections.Counter()
    for r in rows:
        text = r[source_col].strip()
        parts = text.split()
        op = parts[0] if parts else "?"
        if op.startswith("@") and len(parts) > 1:
            op = parts[1]
        by_op[op.split(".")[0]] += number(r[total_col])
    print("\nsamples per opcode:")
    for op, n in by_op.most_common(15):
        print(f"  {100 * n / total:5.1f}%  {op}")
    if reason_cols:
        print("\nsamples per stall reason:")
        sums = {c: sum(number(r[c]) for r in rows) for c in reason_cols}
        for c, n in sorted(sums.items(), key=lambda kv: -kv[1])[:12]:
            if n:
                print(f"  {100 * n / total:5.1f}%  {c}")


if __name__ == "__main__":
    main()
