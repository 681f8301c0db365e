"""One process of the torch.distributed (gloo) tests of test_distributed.py.

usage: distributed_worker.py RANK WORLD INIT_FILE OUT_DIR

A world of 4 processes (one torch import each, which is most of the test's time)
runs the groups of 2, 3 and 4 as subgroups of it, one after the other (each saves
its session: one file per rank and a manifest), then each group loads the snapshot
another group size saved; then ranks 2 and 3 form a group of 2 in which rank 3 dies. Also imported by the tests for the
data and the decode grid, so that the unsharded reference makes exactly the calls
each rank makes.
"""
import datetime
import json
import os
import sys
import time

import numpy as np

N_Q, N_KV, D = 8, 2, 64
SHARD = 8192
N = 26000  # 4 ranks hold 8192, 8192, 8192 and 1424 tokens
CHUNKS = (5000, 7000, 9000, 1)  # appends that end inside shards and cross their boundaries
METHODS = ("dense", "oracle_topk", "pq_topk", "hybrid_uniform", "sampling", "ssa", "ssa_adaptive")
GROUP_MODES = ("off", "mixture", "mean_query")
SIZES = (2, 3, 4)


def data(n=N, seed=5):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((64, N_KV, D))
    topic = rng.integers(0, 64, n)
    k = (centres[topic] + 0.6 * rng.standard_normal((n, N_KV, D))).astype(np.float16)
    v = rng.standard_normal((n, N_KV, D)).astype(np.float16)
    q = (2.0 * centres[3].repeat(N_Q // N_KV, axis=0) + rng.standard_normal((N_Q, D))).astype(np.float16)
    return k, v, q


def make_session(rt):
    return rt.create_session(1, N_Q, N_KV, D, "float16", pq_centroids=16, page_tokens=64,
                             index_min_tokens=4096, index_train_sample=2048, index_iterations=3)


def feed(s, k, v, t0, t1):
    t, i = t0, 0
    while t < t1:
        e = min(t1, t + CHUNKS[i % len(CHUNKS)])
        s.append(0, k[t:e], v[t:e])
        t, i = e, i + 1


def grid(s, q):
    """Every method and group mode: a list of (output bytes, stats tuple)."""
    out = []
    for m in METHODS:
        for g in GROUP_MODES:
            if m == "dense" and g != "off":
                continue
            o, st = s.decode(0, q, method=m, sparsity=20, n_local=700, step=11, group_selection=g, stats=True)
            out.append((o.tobytes(), (st.context_tokens, st.tokens_read, st.heavy_tokens, st.draws,
                                      st.unique_samples, st.residual_proxy_mass, st.scored_tokens)))
    return out


def history(s, k, v, q):
    """The calls every rank (and the reference) makes: the grid after appends, after a
    truncation into the second shard and regrowth, and on a fork taken before it."""
    feed(s, k, v, 0, N)
    res = {"grid": grid(s, q)}
    f = s.fork()
    s.truncate(9000)
    feed(s, k, v, 9000, 20000)
    res["truncated"] = grid(s, q)
    res["fork"] = grid(f, q)
    f.close()
    return res


def save(path, results):
    with open(path, "w") as f:
        json.dump({key: [[o.hex(), list(st)] for o, st in r] for key, r in results.items()}, f)


def main(argv):
    rank, world, init_file, out_dir = int(argv[0]), int(argv[1]), argv[2], argv[3]
    import torch.distributed as dist

    import ssa
    import ssa.distributed

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    # Every process creates every group, in the same order (torch.distributed's rule).
    groups = {size: dist.new_group(list(range(size))) for size in SIZES}
    dying = dist.new_group([2, 3])
    k, v, q = data()
    results = {}
    for size in SIZES:
        if rank < size:
            rt = ssa.distributed.runtime(groups[size], threads=1, shard_tokens=SHARD, seed=1234)
            assert rt.shards == size and rt.rank == rank
            s = make_session(rt)
            res = history(s, k, v, q)
            # Collective: every rank writes its shard's file, rank 0 the manifest (the
            # test loads each group's set in one process; the next loop in other groups).
            s.save(os.path.join(out_dir, "group%d.ssa" % size))
            s.close()
            # A snapshot of one process (written by the test) into this group.
            s = rt.load(os.path.join(out_dir, "single.ssa"))
            res["loaded"] = grid(s, q)
            s.close()
            rt.close()
            results[size] = res
        dist.barrier()
    for size in SIZES:
        if rank < size:
            other = SIZES[(SIZES.index(size) + 1) % len(SIZES)]  # 2 <- 3, 3 <- 4, 4 <- 2
            rt = ssa.distributed.runtime(groups[size], threads=1, shard_tokens=SHARD, seed=1234)
            s = rt.load(os.path.join(out_dir, "group%d.ssa" % other))
            results[size]["from_group"] = grid(s, q)
            s.close()
            rt.close()
            save(os.path.join(out_dir, "size%d_rank%d.json" % (size, rank)), results[size])
        dist.barrier()
    if rank < 2:
        os._exit(0)  # ranks 2 and 3 go on alone; no orderly teardown with a peer about to die
    rt = ssa.distributed.runtime(dying, threads=1, shard_tokens=SHARD, seed=1234, timeout_ms=3000)
    s = make_session(rt)
    feed(s, k, v, 0, 12000)
    s.decode(0, q, sparsity=20)  # the group works
    if rank == 3:
        os._exit(0)  # dies without a word
    t0 = time.monotonic()
    try:
        s.decode(0, q, sparsity=20, step=1)
        result = {"raised": None}
    except ssa.Error as e:
        result = {"raised": type(e).__name__, "status": e.status, "message": str(e)}
    result["seconds"] = time.monotonic() - t0
    try:
        s.decode(0, q, sparsity=20, step=2)
        result["second"] = None
    except ssa.Error as e:
        result["second"] = type(e).__name__
    with open(os.path.join(out_dir, "die.json"), "w") as fh:
        json.dump(result, fh)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
