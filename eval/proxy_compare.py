"""Proxies side by side on a model's real keys and queries, through libssa itself.

For one document window (eval/plan.py, the same ids as the `proxy-` pieces):
the cached dense prefill (eval/prefill_store.py), then `--steps` teacher-forced
decode steps through transformers' sdpa with each layer's query kept. For every
libssa layer (full-attention layers) and every proxy x PQ shape asked for, a
one-layer libssa session (float32, the library's shared object through ctypes,
index trained once at the prefill's length with the default sample and
iterations) holds the layer's keys and values; its snapshot gives back the
codebooks, codes and rotation the library ranks by (eval/pq_proxy.py), and:

  recall / mass  as eval/pq_proxy.py: recall of the exact top-k' by the proxy's
                 top-k' over the candidates between sink and local, and the share
                 of the candidates' exact softmax mass the proxy's top-k' holds;
  error          relative L2 error of libssa's ssa_decode output against its
                 DENSE output for the same query (each step, each query head),
                 for PQ_TOPK, SSA and SSA_ADAPTIVE at 10/20/50x, sink = local =
                 N/256 as the harness uses.

This error is of one decode over the dense prefill's K/V, not the accumulated
teacher-forced error docs/FIDELITY.md's main tables report (there sparse outputs
feed later layers); it compares proxies on the same inputs.

Usage: python eval/proxy_compare.py --model smollm2 --length 8192 \
          --proxies pq:16 opq:16 [--lib build-cpu/libssa.so] [--out FILE.json]
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

PROXY = {"pq": 0, "opq": 1}
METHOD = {"dense": 0, "pq_topk": 2, "ssa": 5, "ssa_adaptive": 6}
FRACTIONS = [0.02, 0.05, 0.10]
SPARSITIES = [10.0, 20.0, 50.0]


class Lib:
    """The few C entry points used, on opaque buffers sized generously: each
    versioned struct is filled by its *_init and then written at the offsets of
    ssa.h's declaration order (checked against ctypes' layout below)."""

    class Config(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("n_layers", ctypes.c_uint32),
                    ("n_q_heads", ctypes.c_uint32), ("n_kv_heads", ctypes.c_uint32),
                    ("head_dim", ctypes.c_uint32), ("kv_dtype", ctypes.c_uint32),
                    ("pq_subspaces", ctypes.c_uint32), ("pq_centroids", ctypes.c_uint32),
                    ("model_fingerprint", ctypes.c_uint64), ("page_tokens", ctypes.c_uint32),
                    ("flags", ctypes.c_uint32), ("index_min_tokens", ctypes.c_uint32),
                    ("index_regrow_factor", ctypes.c_float), ("index_train_sample", ctypes.c_uint32),
                    ("index_iterations", ctypes.c_uint32), ("proxy", ctypes.c_uint32)]

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
                           ("ssa_decode", [v, ctypes.c_uint32, v, v, v, v])]:
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
        if size < ctypes.sizeof(cls):
            raise RuntimeError("the library's %s is shorter than this script's" % cls.__name__)
        view = cls.from_buffer(buf)
        for k, val in fields.items():
            setattr(view, k, val)
        return buf

    def session(self, n_q, n_kv, d, subspaces, proxy, train_at):
        cfg = self._filled(self.L.ssa_session_config_init, self.Config, n_layers=1, n_q_heads=n_q,
                           n_kv_heads=n_kv, head_dim=d, kv_dtype=0, pq_subspaces=subspaces,
                           index_min_tokens=train_at, index_regrow_factor=0.0, proxy=proxy)
        s = ctypes.c_void_p()
        self.check(self.L.ssa_session_create(self.rt, cfg, ctypes.byref(s)), "session_create")
        return s

    def append(self, s, k, v):
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        self.check(self.L.ssa_session_append(s, 0, k.ctypes.data, v.ctypes.data, k.shape[0]), "append")

    def decode(self, s, q, method, sparsity, n_sink, step):
        q = np.ascontiguousarray(q, dtype=np.float32)
        out = np.zeros_like(q)
        p = self._filled(self.L.ssa_decode_params_init, self.Params, method=method, sparsity=sparsity,
                         n_sink=n_sink, n_local=n_sink, seed=1234, step=step)
        self.check(self.L.ssa_decode(s, 0, q.ctypes.data, out.ctypes.data, p, None), "decode")
        return out


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


def measure_layer(lib, K, V, qs, N, ns, proxy, subspaces, snap_path, errors):
    n_kv, n_all, d = K.shape
    n_q = qs[0].shape[0]
    g = n_q // n_kv
    s = lib.session(n_q, n_kv, d, subspaces, PROXY[proxy], N)
    try:
        t0 = time.time()
        lib.append(s, K[:, :N].transpose(1, 0, 2), V[:, :N].transpose(1, 0, 2))  # trains at N
        train_s = time.time() - t0
        out = dict(train_seconds=train_s)
        rows = {f: dict(recall=[], mass_oracle=[], mass_proxy=[]) for f in FRACTIONS}
        err = {}
        for j, q in enumerate(qs):
            n = N + j + 1
            lib.append(s, K[:, n - 1:n].transpose(1, 0, 2), V[:, n - 1:n].transpose(1, 0, 2))
            if j == len(qs) - 1:
                lib.check(lib.L.ssa_session_save(s, snap_path.encode()), "save")
            if errors:
                dense = lib.decode(s, q, METHOD["dense"], 1.0, ns, j)
                for meth in ("pq_topk", "ssa", "ssa_adaptive"):
                    for sp in SPARSITIES:
                        o = lib.decode(s, q, METHOD[meth], sp, ns, j)
                        e = np.linalg.norm(o - dense, axis=1) / np.linalg.norm(dense, axis=1)
                        err.setdefault("%s@%g" % (meth, sp), []).extend(e.tolist())
        snap = pq_proxy.Snapshot(snap_path)
        Ks = snap.keys(0).astype(np.float64)
        codes = snap.codes(0)
        books = snap.codebooks(0).astype(np.float64)
        R = snap.rotation(0)
        R = None if R is None else R.astype(np.float64)
        if (R is None) != (proxy == "pq"):
            raise ValueError("snapshot proxy does not match the session's")
        sub = d // snap.M
        for j, q in enumerate(qs):
            n = N + j + 1
            lo, hi = ns, n - ns
            for h in range(n_q):
                kv = h // g
                logits = Ks[kv, :n] @ q[h] / np.sqrt(d)
                p = np.exp(logits - logits.max())
                p /= p.sum()
                pc = p[lo:hi]
                qr = q[h] if R is None else R[kv] @ q[h]
                lut = np.einsum("ms,mcs->mc", qr.reshape(snap.M, sub), books[kv])
                prox = lut[np.arange(snap.M)[:, None], codes[kv, :, lo:hi]].sum(axis=0)
                for f in FRACTIONS:
                    k = max(1, int(round(f * (hi - lo))))
                    te = np.argpartition(-pc, k - 1)[:k]
                    tp = np.argpartition(-prox, k - 1)[:k]
                    rows[f]["recall"].append(len(np.intersect1d(te, tp)) / k)
                    rows[f]["mass_oracle"].append(float(pc[te].sum() / pc.sum()))
                    rows[f]["mass_proxy"].append(float(pc[tp].sum() / pc.sum()))
        out["by_fraction"] = {str(f): {k: float(np.mean(v)) for k, v in r.items()} for f, r in rows.items()}
        out["error"] = {k: float(np.mean(v)) for k, v in err.items()}
        return out
    finally:
        lib.L.ssa_session_destroy(s)
        if os.path.exists(snap_path):
            os.remove(snap_path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=["smollm2", "gemma3"])
    ap.add_argument("--doc", default="pydoc_topics")
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--proxies", nargs="+", default=["pq:16", "opq:16"],
                    help="PROXY:SUBSPACES, 256 centroids each (SUBSPACES bytes per token per KV head)")
    ap.add_argument("--layers", type=int, nargs="*", help="model layers (default: every full-attention layer)")
    ap.add_argument("--no-errors", action="store_true")
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
    queries, cache = capture_queries(m, stored, run.ids[N:N + a.steps])
    types = getattr(m.config, "layer_types", None) or ["full_attention"] * m.config.num_hidden_layers
    layers = a.layers if a.layers else [i for i, t in enumerate(types) if t == "full_attention"]
    ns = harness.sink_local(N)
    res = dict(model=a.model, doc=a.doc, length=a.length, context=N, steps=a.steps, sink=ns, layers={})
    snap_path = os.path.join(tempfile.gettempdir(), "proxy-compare-%d.ssa" % os.getpid())
    for layer in layers:
        K = cache.layers[layer].keys[0].double().numpy()
        V = cache.layers[layer].values[0].double().numpy()
        res["layers"][str(layer)] = {}
        for spec in a.proxies:
            proxy, sub = spec.split(":")
            t0 = time.time()
            r = measure_layer(lib, K, V, queries[layer], N, ns, proxy, int(sub), snap_path, not a.no_errors)
            res["layers"][str(layer)][spec] = r
            print("layer %d %s: recall@2%% %.3f mass@2%% %.3f  (%.0fs)" % (
                layer, spec, r["by_fraction"]["0.02"]["recall"], r["by_fraction"]["0.02"]["mass_proxy"],
                time.time() - t0), flush=True)
    summary = {}
    for spec in a.proxies:
        per = [res["layers"][str(l)][spec] for l in layers]
        summary[spec] = {
            "recall": {f: float(np.mean([p["by_fraction"][str(f)]["recall"] for p in per])) for f in FRACTIONS},
            "mass_proxy": {f: float(np.mean([p["by_fraction"][str(f)]["mass_proxy"] for p in per]))
                           for f in FRACTIONS},
            "mass_oracle": {f: float(np.mean([p["by_fraction"][str(f)]["mass_oracle"] for p in per]))
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
