"""Proxies side by side on a model's real keys and queries, through libssa itself.

For one document window (eval/plan.py, the same ids as the `proxy-` pieces):
the cached dense prefill (eval/prefill_store.py), then `--steps` teacher-forced
decode steps through transformers' sdpa with each layer's query kept. For every
libssa layer (full-attention layers) and every proxy spec asked for, a one-layer
libssa session (float32, the library's shared object through ctypes, index
trained once at the prefill's length with the default sample and iterations)
holds the layer's keys and values, and each step's key is appended (encoded
with the trained codebooks) before its query is decoded:

  recall / mass  the library's own proxy top-k': a PQ_TOPK decode of budget
                 sink + local + k' through ssa_decode_traced lists the rows it
                 read, so its middle rows are the k' candidates (between sink and
                 local) the proxy ranks highest, exactly as the decode scores them
                 (4-bit proxies: from their quantised tables). Recall is the share
                 of the exact top-k' (float64 q . k of the stored float32 keys)
                 among them; mass the share of the candidates' exact softmax mass
                 they hold (oracle: the exact top-k''s share). k' = f x candidates
                 for f in 2/5/10%.
  recall_float   the same recall for the float table (sum_m q_m . centroid of the
                 codes and codebooks the session's snapshot holds, in float64): for
                 the 4-bit proxies, the recall without the 8-bit table's rounding;
                 for the others, a check (it matches `recall` up to ties).
  error          relative L2 error of libssa's ssa_decode output against its
                 DENSE output for the same query (each step, each query head),
                 for PQ_TOPK, SSA and SSA_ADAPTIVE at 10/20/50x, sink = local =
                 N/256 as the harness uses; ORACLE_TOPK (exact scores, the
                 same for every proxy) beside them as the deterministic ceiling.

This error is of one decode over the dense prefill's K/V, not the accumulated
teacher-forced error docs/FIDELITY.md's main tables report (there sparse outputs
feed later layers); it compares proxies on the same inputs.

A proxy spec is NAME:SUBSPACES[:WEIGHT]: NAME one of pq, opq, qpq (one-byte
codes, 256 centroids: SUBSPACES bytes per token per KV head), pq4, opq4, qpq4
(4-bit codes, 16 centroids: SUBSPACES / 2 bytes); WEIGHT sets
pq_parallel_weight (the score-aware loss; default 1, plain squared error).

--observe S: the first S teacher-forced steps are observation steps: their keys
are appended with the prefill's before the index trains (at N + S tokens, for
every proxy), and the query-aware proxies (qpq, qpq4) are shown their queries
(ssa_session_observe_queries) first; the --steps steps after them are measured.
Without it (S = 0) the index trains at N and qpq learns from no queries.

Usage: python eval/proxy_compare.py --model smollm2 --length 8192 \
          --proxies pq:16 opq:16 pq4:32 pq4:32:8 [--lib build-cpu/libssa.so] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import models  # noqa: E402
import plan  # noqa: E402
import pq_proxy  # noqa: E402
import prefill_store  # noqa: E402

PROXY = {"pq": 0, "opq": 1, "pq4": 2, "opq4": 3, "qpq": 4, "qpq4": 5}
FOUR_BIT = ("pq4", "opq4", "qpq4")
QUERY_AWARE = ("qpq", "qpq4")
METHOD = {"dense": 0, "oracle_topk": 1, "pq_topk": 2, "ssa": 5, "ssa_adaptive": 6}
FRACTIONS = [0.02, 0.05, 0.10]
SPARSITIES = [10.0, 20.0, 50.0]


class Lib:
    """The few C entry points used, on opaque buffers sized generously: each
    versioned struct is filled by its *_init and then written at the offsets of
    ssa.h's declaration order (checked against ctypes' layout below). A field is
    written only where the library's struct_size covers it, so a library built
    before a field existed still serves the specs that leave it alone."""

    class Config(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("n_layers", ctypes.c_uint32),
                    ("n_q_heads", ctypes.c_uint32), ("n_kv_heads", ctypes.c_uint32),
                    ("head_dim", ctypes.c_uint32), ("kv_dtype", ctypes.c_uint32),
                    ("pq_subspaces", ctypes.c_uint32), ("pq_centroids", ctypes.c_uint32),
                    ("model_fingerprint", ctypes.c_uint64), ("page_tokens", ctypes.c_uint32),
                    ("flags", ctypes.c_uint32), ("index_min_tokens", ctypes.c_uint32),
                    ("index_regrow_factor", ctypes.c_float), ("index_train_sample", ctypes.c_uint32),
                    ("index_iterations", ctypes.c_uint32), ("proxy", ctypes.c_uint32),
                    ("pq_parallel_weight", ctypes.c_float)]

    class Params(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("method", ctypes.c_uint32),
                    ("budget", ctypes.c_uint32), ("sparsity", ctypes.c_float),
                    ("heavy_fraction", ctypes.c_float), ("n_sink", ctypes.c_uint32),
                    ("n_local", ctypes.c_uint32), ("pi_min", ctypes.c_float),
                    ("seed", ctypes.c_uint64), ("step", ctypes.c_uint64)]

    def __init__(self, path):
        self.L = ctypes.CDLL(path)
        v = ctypes.c_void_p
        for name, args in [("ssa_runtime_create", [v, v]), ("ssa_session_create", [v, v, v]),
                           ("ssa_session_append", [v, ctypes.c_uint32, v, v, ctypes.c_uint64]),
                           ("ssa_session_save", [v, ctypes.c_char_p]),
                           ("ssa_decode", [v, ctypes.c_uint32, v, v, v, v]),
                           ("ssa_decode_traced", [v, ctypes.c_uint32, v, v, v, v, v, v, ctypes.c_uint64, v]),
                           ("ssa_session_observe_queries", [v, ctypes.c_uint32, v, ctypes.c_uint64])]:
            getattr(self.L, name).argtypes = args
            getattr(self.L, name).restype = ctypes.c_int
        self.L.ssa_last_error_message.restype = ctypes.c_char_p
        self.L.ssa_session_destroy.argtypes = [v]
        self.L.ssa_session_config_init.argtypes = [v]
        self.L.ssa_decode_params_init.argtypes = [v]
        self.rt = v()
        self.check(self.L.ssa_runtime_create(None, ctypes.byref(self.rt)), "runtime")

    def check(self, st, what):
        if st != 0:
            raise RuntimeError("%s: status %d: %s" % (what, st, self.L.ssa_last_error_message().decode()))

    def _filled(self, init, cls, **fields):
        buf = (ctypes.c_uint8 * 1024)()
        init(buf)
        size = struct.unpack_from("<I", bytes(buf[:4]))[0]
        view = cls.from_buffer(buf)
        for k, val in fields.items():
            f = getattr(cls, k)
            if f.offset + f.size > size:
                raise RuntimeError("the library's %s (struct_size %d) has no field %s" % (cls.__name__, size, k))
            setattr(view, k, val)
        return buf

    def session(self, n_q, n_kv, d, subspaces, centroids, proxy, weight, train_at, training=None):
        extra = {} if weight is None else dict(pq_parallel_weight=weight)
        extra.update(training or {})
        cfg = self._filled(self.L.ssa_session_config_init, self.Config, n_layers=1, n_q_heads=n_q,
                           n_kv_heads=n_kv, head_dim=d, kv_dtype=0, pq_subspaces=subspaces,
                           pq_centroids=centroids, index_min_tokens=train_at, index_regrow_factor=0.0,
                           proxy=proxy, **extra)
        s = ctypes.c_void_p()
        self.check(self.L.ssa_session_create(self.rt, cfg, ctypes.byref(s)), "session_create")
        return s

    def append(self, s, k, v):
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        self.check(self.L.ssa_session_append(s, 0, k.ctypes.data, v.ctypes.data, k.shape[0]), "append")

    def observe(self, s, qs):
        q = np.ascontiguousarray(np.stack(qs), dtype=np.float32)  # [n][n_q][d]
        self.check(self.L.ssa_session_observe_queries(s, 0, q.ctypes.data, q.shape[0]), "observe_queries")

    def params(self, method, n_sink, step, sparsity=0.0, budget=0):
        return self._filled(self.L.ssa_decode_params_init, self.Params, method=method, sparsity=sparsity,
                            budget=budget, n_sink=n_sink, n_local=n_sink, seed=1234, step=step)

    def decode(self, s, q, method, sparsity, n_sink, step):
        q = np.ascontiguousarray(q, dtype=np.float32)
        out = np.zeros_like(q)
        p = self.params(method, n_sink, step, sparsity=sparsity)
        self.check(self.L.ssa_decode(s, 0, q.ctypes.data, out.ctypes.data, p, None), "decode")
        return out

    def proxy_topk(self, s, q, n_sink, k, step):
        """Per query head, the sorted token indices a PQ_TOPK decode of budget
        2 n_sink + k reads (sink, local and the proxy's top k candidates)."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        n_q = q.shape[0]
        out = np.zeros_like(q)
        budget = 2 * n_sink + k
        p = self.params(METHOD["pq_topk"], n_sink, step, budget=budget)
        cap = n_q * budget
        tokens = np.zeros(cap, dtype=np.uint32)
        offsets = np.zeros(n_q + 1, dtype=np.uint64)
        self.check(self.L.ssa_decode_traced(s, 0, q.ctypes.data, out.ctypes.data, p, None, tokens.ctypes.data,
                                            None, cap, offsets.ctypes.data), "decode_traced")
        return [tokens[offsets[h]:offsets[h + 1]].astype(np.int64) for h in range(n_q)]


def capture_queries(m, stored, feed):
    """Teacher-forced steps after the stored prefill; per model layer, the list
    of [n_q, d] queries (as attention sees them: after RoPE and any q-norm), and
    the cache holding every step's keys."""
    from transformers import AttentionInterface, DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    kept = {}
    on = [False]

    def attend(module, query, key, value, attention_mask, **kw):
        if on[0]:
            kept.setdefault(module.layer_idx, []).append(query[0, :, -1, :].double().numpy().copy())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    AttentionInterface.register("keep_queries", attend)
    m.model.set_attn_implementation("keep_queries")
    cache = DynamicCache(config=m.model.config)
    prefill_store.into_cache(stored, cache, m.model)
    N = len(stored["ids"])
    on[0] = True
    with torch.no_grad():
        for j, t in enumerate(feed):
            m.model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True, logits_to_keep=1,
                    cache_position=torch.tensor([N + j]))
    on[0] = False
    return kept, cache


def parse_spec(spec):
    """NAME:SUBSPACES[:WEIGHT] -> (name, subspaces, centroids, weight or None)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] not in PROXY:
        raise SystemExit("bad proxy spec %r (NAME:SUBSPACES[:WEIGHT], NAME in %s)" % (spec, ", ".join(PROXY)))
    return (parts[0], int(parts[1]), 16 if parts[0] in FOUR_BIT else 256,
            float(parts[2]) if len(parts) == 3 else None)


def float_table_topk(snap, q, kv, lo, hi, k):
    """The top k candidates in [lo, hi) by the float64 table of the snapshot's
    codebooks (after its rotation), as offsets from lo."""
    sub = snap.d // snap.M
    R = snap.rotation(0)
    qr = q.astype(np.float64) if R is None else R[kv].astype(np.float64) @ q.astype(np.float64)
    books = snap.codebooks(0)[kv].astype(np.float64)
    lut = np.einsum("ms,mcs->mc", qr.reshape(snap.M, sub), books)
    codes = snap.codes(0)[kv, :, lo:hi]
    prox = lut[np.arange(snap.M)[:, None], codes].sum(axis=0)
    return np.argpartition(-prox, k - 1)[:k]


def measure_layer(lib, K, V, qs, N, ns, spec, errors, observe=0, training=None):
    """qs: the queries of every captured step; the first `observe` are shown
    (query-aware proxies) and their keys appended before training, the rest measured.
    training: session config fields of the index's training (index_iterations,
    index_train_sample) other than the library's defaults."""
    name, subspaces, centroids, weight = parse_spec(spec)
    n_kv, n_all, d = K.shape
    n_q = qs[0].shape[0]
    g = n_q // n_kv
    K32 = K.astype(np.float32)   # what the session holds; exact scores from these
    s = lib.session(n_q, n_kv, d, subspaces, centroids, PROXY[name], weight, N + observe, training)
    try:
        t0 = time.time()
        if observe and name in QUERY_AWARE:
            lib.observe(s, qs[:observe])
        M = N + observe
        lib.append(s, K[:, :M].transpose(1, 0, 2), V[:, :M].transpose(1, 0, 2))  # trains at N + observe
        train_s = time.time() - t0
        out = dict(train_seconds=train_s, bytes_per_token=subspaces // 2 if name in FOUR_BIT else subspaces)
        rows = {f: dict(recall=[], mass_oracle=[], mass_proxy=[], recall_float=[]) for f in FRACTIONS}
        err = {}
        snap_path = os.path.join(tempfile.gettempdir(), "proxy-compare-%d.ssa" % os.getpid())
        for j, q in enumerate(qs):
            if j < observe:
                continue
            n = N + j + 1
            lib.append(s, K[:, n - 1:n].transpose(1, 0, 2), V[:, n - 1:n].transpose(1, 0, 2))
            lib.check(lib.L.ssa_session_save(s, snap_path.encode()), "save")
            snap = pq_proxy.Snapshot(snap_path)
            os.remove(snap_path)
            lo, hi = ns, n - ns
            for f in FRACTIONS:
                k = max(1, int(round(f * (hi - lo))))
                read = lib.proxy_topk(s, q, ns, k, j)
                for h in range(n_q):
                    logits = K32[h // g, :n].astype(np.float64) @ q[h].astype(np.float32).astype(np.float64)
                    p = np.exp((logits - logits.max()) / np.sqrt(d))
                    pc = p[lo:hi]
                    mid = read[h][(read[h] >= lo) & (read[h] < hi)] - lo
                    if len(mid) != k or len(read[h]) != k + 2 * ns:
                        raise RuntimeError("head %d read %d rows, %d of them candidates; expected %d + %d"
                                           % (h, len(read[h]), len(mid), k, 2 * ns))
                    te = np.argpartition(-pc, k - 1)[:k]
                    rows[f]["recall"].append(len(np.intersect1d(te, mid)) / k)
                    rows[f]["mass_oracle"].append(float(pc[te].sum() / pc.sum()))
                    rows[f]["mass_proxy"].append(float(pc[mid].sum() / pc.sum()))
                    tf = float_table_topk(snap, q[h].astype(np.float32), h // g, lo, hi, k)
                    rows[f]["recall_float"].append(len(np.intersect1d(te, tf)) / k)
            if errors:
                dense = lib.decode(s, q, METHOD["dense"], 1.0, ns, j)
                for meth in ("oracle_topk", "pq_topk", "ssa", "ssa_adaptive"):
                    for sp in SPARSITIES:
                        o = lib.decode(s, q, METHOD[meth], sp, ns, j)
                        e = np.linalg.norm(o - dense, axis=1) / np.linalg.norm(dense, axis=1)
                        err.setdefault("%s@%g" % (meth, sp), []).extend(e.tolist())
        out["by_fraction"] = {str(f): {k: float(np.mean(v)) for k, v in r.items()} for f, r in rows.items()}
        out["error"] = {k: float(np.mean(v)) for k, v in err.items()}
        return out
    finally:
        lib.L.ssa_session_destroy(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=["smollm2", "gemma3"])
    ap.add_argument("--doc", default="pydoc_topics")
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--proxies", nargs="+", default=["pq:16", "opq:16"],
                    help="NAME:SUBSPACES[:WEIGHT] (see the module's doc)")
    ap.add_argument("--layers", type=int, nargs="*", help="model layers (default: every full-attention layer)")
    ap.add_argument("--no-errors", action="store_true")
    ap.add_argument("--observe", type=int, default=0, help="observation steps before the index trains")
    ap.add_argument("--iterations", type=int, help="index_iterations (default: the library's)")
    ap.add_argument("--train-sample", type=int, help="index_train_sample (default: the library's)")
    ap.add_argument("--lib", default=os.path.join(HERE, "..", "build-cpu", "libssa.so"))
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    lib = Lib(a.lib)
    m = models.load(a.model, attn="sdpa")
    run = plan.doc_run(m, a.doc, a.length)
    N = run.n_context
    if not prefill_store.have(a.model, run.ids[:N]):
        prefill_store.compute(m, run.ids[:N])
    stored = prefill_store.load(a.model, run.ids[:N])
    ids = run.ids if a.observe == 0 else plan.doc_ids(m, a.doc)
    if ids[:N] != run.ids[:N] or len(ids) < N + a.observe + a.steps:
        raise SystemExit("%s: %d tokens, %d needed after the window's prefill" % (a.doc, len(ids), N + a.observe + a.steps))
    queries, cache = capture_queries(m, stored, ids[N:N + a.observe + a.steps])
    types = getattr(m.config, "layer_types", None) or ["full_attention"] * m.config.num_hidden_layers
    layers = a.layers if a.layers else [i for i, t in enumerate(types) if t == "full_attention"]
    ns = harness.sink_local(N)
    res = dict(model=a.model, doc=a.doc, length=a.length, context=N, steps=a.steps, observe=a.observe, sink=ns,
               layers={})
    training = {k: v for k, v in (("index_iterations", a.iterations), ("index_train_sample", a.train_sample))
                if v is not None}
    res["training"] = training
    for layer in layers:
        K = cache.layers[layer].keys[0].double().numpy()
        V = cache.layers[layer].values[0].double().numpy()
        res["layers"][str(layer)] = {}
        for spec in a.proxies:
            t0 = time.time()
            r = measure_layer(lib, K, V, queries[layer], N, ns, spec, not a.no_errors, a.observe, training)
            res["layers"][str(layer)][spec] = r
            print("layer %d %s: recall@2%% %.3f (float table %.3f) mass@2%% %.3f  (%.0fs)" % (
                layer, spec, r["by_fraction"]["0.02"]["recall"], r["by_fraction"]["0.02"]["recall_float"],
                r["by_fraction"]["0.02"]["mass_proxy"], time.time() - t0), flush=True)
    summary = {}
    for spec in a.proxies:
        per = [res["layers"][str(l)][spec] for l in layers]
        summary[spec] = {
            "recall": {f: float(np.mean([p["by_fraction"][str(f)]["recall"] for p in per])) for f in FRACTIONS},
            "mass_proxy": {f: float(np.mean([p["by_fraction"][str(f)]["mass_proxy"] for p in per]))
                           for f in FRACTIONS},
            "mass_oracle": {f: float(np.mean([p["by_fraction"][str(f)]["mass_oracle"] for p in per]))
                            for f in FRACTIONS},
            "recall_float": {f: float(np.mean([p["by_fraction"][str(f)]["recall_float"] for p in per]))
                             for f in FRACTIONS},
            "error": {k: float(np.mean([p["error"][k] for p in per])) for k in per[0]["error"]},
            "train_seconds": float(np.sum([p["train_seconds"] for p in per])),
        }
    res["summary"] = summary
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
