"""Dense attention in numpy: one decode step (the reference both model files and
the evaluation compare libssa against) and the chunked causal attention of a
prefill, which both model files run."""
from __future__ import annotations

import numpy as np


def dense_attention(q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """q [n_q, d] over K/V [n, n_kv, d]: scale 1/sqrt(d), GQA."""
    n_q, d = q.shape
    g = n_q // K.shape[1]
    out = np.empty_like(q)
    for h in range(n_q):
        sc = K[:, h // g, :] @ q[h] / np.sqrt(d)
        p = np.exp(sc - sc.max())
        out[h] = (p / p.sum()) @ V[:, h // g, :]
    return out


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, past: int, chunk: int,
                     window: int | None = None) -> np.ndarray:
    """Prefill attention of T new queries at positions past .. past + T - 1: q
    [T, n_q, d] over k/v [past + T, n_kv, d] (scale 1/sqrt(d), GQA), causal, and
    with `window` each query sees only its last `window` keys. Chunks of `chunk`
    queries keep the score matrices small. Returns [T, n_q, d] float32."""
    T, nq, d = q.shape
    nkv = k.shape[1]
    g = nq // nkv
    scale = np.float32(1.0 / np.sqrt(d))
    attn = np.empty((T, nq, d), dtype=np.float32)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        C = e - s
        k0 = max(0, past + s - window + 1) if window else 0  # first key any query here may see
        qpos = np.arange(past + s, past + e)[:, None]
        kpos = np.arange(k0, past + e)[None, :]
        masked = kpos > qpos
        if window:
            masked |= kpos <= qpos - window
        for kh in range(nkv):
            qg = q[s:e, kh * g:(kh + 1) * g, :].transpose(1, 0, 2).reshape(g * C, d)
            sc = (qg @ k[k0:past + e, kh, :].T) * scale
            sc = sc.reshape(g, C, past + e - k0)
            sc[:, masked] = -np.inf
            sc -= sc.max(axis=-1, keepdims=True)
            np.exp(sc, out=sc)
            sc /= sc.sum(axis=-1, keepdims=True)
            o = sc.reshape(g * C, past + e - k0) @ v[k0:past + e, kh, :]
            attn[s:e, kh * g:(kh + 1) * g, :] = o.reshape(g, C, d).transpose(1, 0, 2)
    return attn
