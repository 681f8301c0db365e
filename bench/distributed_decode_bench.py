#!/usr/bin/env python3
"""Decode time of a session split over a group of CPU processes (ssa.distributed over
torch.distributed gloo) against one process holding the whole session, in one run:
first the single process, then the group (one after the other, so that they never
compete for the cores or the memory). docs/DISTRIBUTED.md.

Every process runs a runtime of `--threads` worker threads, builds the same session
(the same rows, from per-chunk seeds; every rank is given every row and keeps its
shard's) and times `--reps` decodes of each method (median). In the group each rank
holds and reads its half; the collectives' share is the time spent inside the callbacks
(waiting for the slower rank included) over the decode time. Each decode's process CPU
time is reported beside its wall time: on cores shared with other work the wall ratio
measures the contention as much as the decode, the busiest rank's CPU time against the
single process's does not (a group on free cores takes about that plus the exchanges). Also reported: each
process's resident memory after building the session (the K/V it holds), and the time
to build it (appends and the index training, which a group trains on a gathered sample).

usage: distributed_decode_bench.py [--tokens 1048576] [--ranks 2] [--threads 1] [--reps 5]
"""
import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SHAPE = dict(n_q=16, n_kv=4, d=256)  # the paper's shape, float16
CHUNK = 65536
METHODS = (("dense", "off"), ("ssa", "off"), ("ssa", "mean_query"))


def build(rt, n):
    s = rt.create_session(1, SHAPE["n_q"], SHAPE["n_kv"], SHAPE["d"], "float16")
    base_rng = np.random.default_rng(1)
    base_k = base_rng.standard_normal((CHUNK, SHAPE["n_kv"], SHAPE["d"]), dtype=np.float32).astype(np.float16)
    base_v = base_rng.standard_normal((CHUNK, SHAPE["n_kv"], SHAPE["d"]), dtype=np.float32).astype(np.float16)
    for c, t in enumerate(range(0, n, CHUNK)):
        perm = np.random.default_rng(100 + c).permutation(CHUNK)[: min(CHUNK, n - t)]
        s.append(0, base_k[perm], base_v[perm])
    s.update_index()
    q = np.random.default_rng(2).standard_normal((SHAPE["n_q"], SHAPE["d"]), dtype=np.float32).astype(np.float16)
    return s, q


def rss_gib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / (1 << 20)
    return float("nan")


def time_decodes(s, q, reps, comm=None):
    # As a long-running server would: the objects made so far (torch's, in a rank)
    # move out of the collector's reach, so that the collections the exchanges'
    # small allocations trigger do not rescan them (8% of a rank's decode at 256K).
    gc.collect()
    gc.freeze()
    res = {}
    for m, g in METHODS:
        s.decode(0, q, method=m, sparsity=50, group_selection=g)  # warm-up
        times, cpu, coll = [], [], []
        for r in range(reps):
            c0 = comm.seconds if comm else 0.0
            t0, p0 = time.perf_counter(), time.process_time()
            s.decode(0, q, method=m, sparsity=50, group_selection=g, step=r)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - p0)
            coll.append((comm.seconds - c0) if comm else 0.0)
        i = sorted(range(reps), key=lambda j: times[j])[reps // 2]
        res["%s/%s" % (m, g)] = dict(ms=1e3 * times[i], coll_ms=1e3 * coll[i], cpu_ms=1e3 * sorted(cpu)[reps // 2])
    return res


def single(args):
    import ssa

    with ssa.Runtime(backend="cpu", threads=args.threads) as rt:
        t0 = time.perf_counter()
        s, q = build(rt, args.tokens)
        built = dict(build_s=time.perf_counter() - t0, rss_gib=rss_gib())
        res = time_decodes(s, q, args.reps)
        s.close()
        return res, built


def rank_main(args):
    import torch
    import torch.distributed as dist

    import ssa.distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + args.init, rank=args.rank, world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=600))
    comm = ssa.distributed.TorchCollective(timeout_ms=600000)
    shard = -(-args.tokens // args.ranks // 8192) * 8192
    rt = ssa.Runtime(backend="cpu", threads=args.threads, shard_tokens=shard, collective=comm)
    t0 = time.perf_counter()
    s, q = build(rt, args.tokens)
    built = dict(build_s=time.perf_counter() - t0, rss_gib=rss_gib())
    dist.barrier()
    res = time_decodes(s, q, args.reps, comm)
    with open(args.out, "w") as f:
        json.dump(dict(decodes=res, built=built), f)
    s.close()
    rt.close()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--init", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.rank >= 0:
        return rank_main(args)
    print("load average before: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    one, one_built = single(args)
    print("load average after the single process: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [subprocess.Popen([sys.executable, __file__, "--tokens", str(args.tokens), "--ranks",
                                   str(args.ranks), "--threads", str(args.threads), "--reps", str(args.reps),
                                   "--rank", str(r), "--init", init, "--out", os.path.join(tmp, "r%d" % r)])
                 for r in range(args.ranks)]
        for p in procs:
            if p.wait() != 0:
                sys.exit("a rank failed")
        got = [json.load(open(os.path.join(tmp, "r%d" % r))) for r in range(args.ranks)]
        ranks = [g["decodes"] for g in got]
    print("load average after the group: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    print("\n%d tokens, 16 q / 4 KV heads, d 256, f16, %d thread(s) per process, 50x, median of %d\n"
          % (args.tokens, args.threads, args.reps))
    print("| method | 1 process (ms) | %d ranks (ms, slowest rank) | ratio | collectives (ms, share) "
          "| CPU ms: 1 process / busiest rank | CPU ratio |" % args.ranks)
    print("|---|---|---|---|---|---|---|")
    for key in one:
        g = max(ranks, key=lambda r: r[key]["ms"])[key]
        busiest = max(r[key]["cpu_ms"] for r in ranks)
        print("| %s | %.1f | %.1f | %.2fx | %.1f (%.0f%%) | %.1f / %.1f | %.2fx |"
              % (key, one[key]["ms"], g["ms"], g["ms"] / one[key]["ms"], g["coll_ms"], 100 * g["coll_ms"] / g["ms"],
                 one[key]["cpu_ms"], busiest, busiest / one[key]["cpu_ms"]))
    print("\nCPU ms: the process's CPU time over the decode (its worker thread, gloo's threads and "
          "Python), the median of the reps: what each rank computes, whatever else shares the cores.")
    print("\nbuilding the session (appends + index): 1 process %.1f s, %.1f GiB resident; ranks %s"
          % (one_built["build_s"], one_built["rss_gib"],
             ", ".join("%.1f s, %.1f GiB" % (g["built"]["build_s"], g["built"]["rss_gib"]) for g in got)))


if __name__ == "__main__":
    main()
