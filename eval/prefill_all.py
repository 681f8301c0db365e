#!/usr/bin/env python3
"""Computes the dense prefills the evaluation needs (eval/prefill_store.py), in
the order given, skipping those already cached.

  python eval/prefill_all.py --model gemma3 --docs pydoc_topics --tasks niah_single ... --seeds 0
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import models  # noqa: E402
import plan  # noqa: E402
import prefill_store  # noqa: E402
import ruler  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(models.GGUF))
    ap.add_argument("--docs", nargs="*", default=[])
    ap.add_argument("--tasks", nargs="*", default=[])
    ap.add_argument("--lengths", nargs="*", type=int, default=None)
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lengths = args.lengths or plan.LENGTHS[args.model]
    m = models.load(args.model, attn="sdpa")
    for doc in args.docs:
        ids = plan.doc_ids(m, doc)
        runs = [plan.doc_run(m, doc, L, ids) for L in lengths]
        t = time.time()
        longest = max(runs, key=lambda r: r.n_context)
        prefill_store.compute(m, longest.ids[: longest.n_context], [r.n_context for r in runs])
        print("doc %s: prefills at %s in %.0fs" % (doc, [r.n_context for r in runs], time.time() - t), flush=True)
    for seed in args.seeds:
        for L in lengths:
            for task in args.tasks:
                c = plan.ruler_context(m, task, L, seed)
                ids = m.encode(c.prefix)
                t = time.time()
                prefill_store.compute(m, ids)
                print("%s L=%d seed %d: %d prefix tokens in %.0fs" % (task, L, seed, len(ids), time.time() - t),
                      flush=True)


if __name__ == "__main__":
    main()
