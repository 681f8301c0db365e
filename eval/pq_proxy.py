"""How well the PQ proxy ranks tokens, per libssa layer, on real queries.

A few teacher-forced decode steps run through an SSACache (DENSE) while an
observer keeps each libssa layer's query. The session is then saved and its own
PQ codebooks, codes and keys are read back from the snapshot
(docs/SNAPSHOT_FORMAT.md), so the proxy scores are those libssa ranks by:
score(t) = sum over subspaces m of q_m . centroid[code_m(t)] (lib/decode/cpu_decode.cc).

Per layer and budget fraction f (k' = f x the candidate tokens between sink and
local, what a top-k method selects at sparsity ~1/f once sink and local are
counted): recall of the exact top-k' by the proxy top-k', and the share of the
candidates' exact softmax mass each captures (oracle = exact top-k', pq = proxy
top-k'), and the share of the whole softmax mass that sink + local hold.
"""
from __future__ import annotations

import os
import struct
from typing import Dict, List, Sequence

import numpy as np
import torch

import harness
import prefill_store

MAGIC = b"\x89SSASNP\n"


class Snapshot:
    """The committed state of a snapshot file, bounds-checked as it is read."""

    def __init__(self, path: str):
        self.buf = open(path, "rb").read()
        best = None
        for slot in (0, 2048):
            h = self.buf[slot:slot + 128]
            if len(h) == 128 and h[:8] == MAGIC:
                gen, toff, tlen = struct.unpack_from("<QQQ", h, 24)
                if best is None or gen > best[0]:
                    best = (gen, toff, tlen, slot)
        if best is None:
            raise ValueError("%s: no valid superblock" % path)
        _, toff, tlen, slot = best
        self.version = struct.unpack_from("<I", self.buf, slot + 8)[0]
        self._check(toff, tlen)
        if self.buf[toff:toff + 8] != b"SSATABLE":
            raise ValueError("%s: bad section table" % path)
        n, esz = struct.unpack_from("<II", self.buf, toff + 8)
        if esz != 64 or 64 + n * 64 != tlen:
            raise ValueError("%s: section table size" % path)
        self.sections = []
        for i in range(n):
            kind, layer, off, length, _align, _flags, _x, first, count = struct.unpack_from(
                "<IIQQIIQQQ", self.buf, toff + 64 + 64 * i)
            self._check(off, length)
            self.sections.append((kind, layer, off, length, first, count))
        cfg = self._one(1)
        (self.n_layers, self.n_q, self.n_kv, self.d, self.dtype, self.M, self.K,
         self.P) = struct.unpack_from("<8I", self.buf, cfg[2])
        if self.dtype != 0:
            raise ValueError("only float32 sessions are read here (kv_dtype %d)" % self.dtype)
        # Format version 2: the proxy (0 PQ, 1 OPQ) at config offset 52; reserved in 1.
        # Version 3: also 2 PQ4, 3 OPQ4 (two 4-bit codes per byte), 4 QPQ, 5 QPQ4.
        self.proxy = struct.unpack_from("<I", self.buf, cfg[2] + 52)[0] if self.version >= 2 else 0
        if self.proxy not in (tuple(range(6)) if self.version >= 3 else (0, 1)):
            raise ValueError("unknown proxy %d" % self.proxy)
        self.rotated = self.proxy in (1, 3, 4, 5)       # a key transform follows the centroids
        self.query_aware = self.proxy in (4, 5)         # then the query transform and moments
        self.code_rows = self.M // 2 if self.proxy in (2, 3, 5) else self.M
        lay = self._one(2)
        if lay[3] != 32 * self.n_layers:
            raise ValueError("layers section size")
        self.n_tokens = [struct.unpack_from("<Q", self.buf, lay[2] + 32 * i)[0] for i in range(self.n_layers)]

    def _check(self, off, length):
        if off + length > len(self.buf):
            raise ValueError("section [%d, +%d) beyond the file (%d bytes)" % (off, length, len(self.buf)))

    def _one(self, kind):
        s = [x for x in self.sections if x[0] == kind]
        if len(s) != 1:
            raise ValueError("expected one section of kind %d, found %d" % (kind, len(s)))
        return s[0]

    def _pages(self, kind, layer, page_bytes):
        pages = {}
        for k, l, off, length, first, count in self.sections:   # later entries win
            if k == kind and l == layer:
                if length != count * page_bytes:
                    raise ValueError("page run size")
                for j in range(count):
                    pages[first + j] = off + j * page_bytes
        n_pages = -(-self.n_tokens[layer] // self.P)
        if any(p not in pages for p in range(n_pages)):
            raise ValueError("layer %d: a page is missing" % layer)
        return [pages[p] for p in range(n_pages)]

    def keys(self, layer) -> np.ndarray:
        """[n_kv, n_tokens, d] float32."""
        pb = 2 * self.n_kv * self.P * self.d * 4
        out = [np.frombuffer(self.buf, np.float32, self.n_kv * self.P * self.d, off).reshape(self.n_kv, self.P, self.d)
               for off in self._pages(3, layer, pb)]
        return np.concatenate(out, axis=1)[:, : self.n_tokens[layer]]

    def codes(self, layer) -> np.ndarray:
        """[n_kv, M, n_tokens] uint8 (4-bit codes unpacked: row r holds subspace
        2r in its low nibble, 2r + 1 in its high nibble)."""
        pb = self.n_kv * self.code_rows * self.P
        out = [np.frombuffer(self.buf, np.uint8, pb, off).reshape(self.n_kv, self.code_rows, self.P)
               for off in self._pages(4, layer, pb)]
        rows = np.concatenate(out, axis=2)[:, :, : self.n_tokens[layer]]
        if self.code_rows == self.M:
            return rows
        codes = np.empty((self.n_kv, self.M, rows.shape[2]), np.uint8)
        codes[:, 0::2] = rows & 0x0F
        codes[:, 1::2] = rows >> 4
        return codes

    def codebooks(self, layer) -> np.ndarray:
        """[n_kv, M, K, sub_dim] float32."""
        s = [x for x in self.sections if x[0] == 5 and x[1] == layer]
        if len(s) != 1:
            raise ValueError("layer %d has %d codebook sections" % (layer, len(s)))
        off = s[0][2]
        n_kv, M, K, sub = struct.unpack_from("<4I", self.buf, off)
        square = n_kv * self.d * self.d
        rot = 4 * square if self.rotated else 0
        if self.query_aware:
            rot += 4 * square + 8 * n_kv + 8 * square
            if self.version >= 4:  # the recent queries: counts, then [n_kv][256][d] floats
                rot += 8 * n_kv + 4 * n_kv * 256 * self.d
        if (n_kv, M, K, sub * M) != (self.n_kv, self.M, self.K, self.d) or s[0][3] != 16 + 4 * n_kv * M * K * sub + rot:
            raise ValueError("codebook shape")
        return np.frombuffer(self.buf, np.float32, n_kv * M * K * sub, off + 16).reshape(n_kv, M, K, sub)

    def rotation(self, layer):
        """[n_kv, d, d] float32 matrix a query is multiplied by before scoring: the
        rotation R of an OPQ/OPQ4 snapshot (codes quantise R k), the query
        transform T^-T of a QPQ/QPQ4 one (codes quantise T k); None for the others."""
        if not self.rotated:
            return None
        self.codebooks(layer)  # checks the section's shape and length
        off = [x for x in self.sections if x[0] == 5 and x[1] == layer][0][2]
        off += 16 + 4 * self.n_kv * self.M * self.K * (self.d // self.M)
        if self.query_aware:
            off += 4 * self.n_kv * self.d * self.d
        return np.frombuffer(self.buf, np.float32, self.n_kv * self.d * self.d, off).reshape(self.n_kv, self.d, self.d)


def measure(loaded, stored: Dict, feed: Sequence[int], fractions: Sequence[float], snap_path: str) -> Dict:
    N = len(stored["ids"])
    ns = harness.sink_local(N)
    queries: Dict[int, List[np.ndarray]] = {}

    def keep(layer_idx, query, output, stats, cache):
        queries.setdefault(int(layer_idx), []).append(query.reshape(query.shape[-2], query.shape[-1]).double().numpy())

    rec = harness.Recorder()
    rec.active = False
    cache = harness.make_base(loaded, stored, rec, ns)
    if getattr(cache, "observer", None) is rec:
        cache.observer = keep
    harness.teacher_forced(loaded, cache, N, stored["logits"], list(feed))
    cache.sessions[0].save(snap_path)
    snap = Snapshot(snap_path)
    g = snap.n_q // snap.n_kv
    sub = snap.d // snap.M
    out = {}
    for model_layer, qs in sorted(queries.items()):
        sl = cache.layer_of(model_layer)
        K = snap.keys(sl).astype(np.float64)
        codes = snap.codes(sl)
        books = snap.codebooks(sl).astype(np.float64)
        R = snap.rotation(sl)
        R = None if R is None else R.astype(np.float64)
        rows = {f: dict(recall=[], mass_oracle=[], mass_pq=[]) for f in fractions}
        fixed_mass = []
        for j, q in enumerate(qs):
            n = N + j + 1                      # tokens this query attended
            lo, hi = ns, n - ns
            for h in range(snap.n_q):
                kv = h // g
                logits = K[kv, :n] @ q[h] / np.sqrt(snap.d)
                p = np.exp(logits - logits.max())
                p /= p.sum()
                fixed_mass.append(float(p[:lo].sum() + p[hi:].sum()))
                pc = p[lo:hi]
                qr = q[h] if R is None else R[kv] @ q[h]
                lut = np.einsum("ms,mcs->mc", qr.reshape(snap.M, sub), books[kv])
                proxy = lut[np.arange(snap.M)[:, None], codes[kv, :, lo:hi]].sum(axis=0)
                for f in fractions:
                    k = max(1, int(round(f * (hi - lo))))
                    top_exact = np.argpartition(-pc, k - 1)[:k]
                    top_pq = np.argpartition(-proxy, k - 1)[:k]
                    rows[f]["recall"].append(len(np.intersect1d(top_exact, top_pq)) / k)
                    tot = pc.sum()
                    rows[f]["mass_oracle"].append(float(pc[top_exact].sum() / tot))
                    rows[f]["mass_pq"].append(float(pc[top_pq].sum() / tot))
        out[str(model_layer)] = dict(
            sink_local_mass=float(np.mean(fixed_mass)),
            by_fraction={str(f): {k: float(np.mean(v)) for k, v in r.items()} for f, r in rows.items()})
    try:
        os.remove(snap_path)
    except OSError:
        pass
    return dict(sink=ns, local=ns, layers=out)
