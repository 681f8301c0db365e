"""The layer loop both numpy models run (smollm.py, gemma3.py): prefill with dense
causal attention, one decode step with pluggable attention, and the dense decode
reference over a growing cache. A model subclasses NumpyDecoder and provides
layers (dicts with "attn_norm" and, on sliding-window layers, "local": True),
window, n_q, head_dim, embed_tokens, _rms, _qkv, _attn_out, _mlp and logits."""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import numpy as np

from attention_ref import causal_attention, dense_attention

AttnFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""attend(layer, q [n_q, d], k [n_kv, d], v [n_kv, d]) -> out [n_q, d]; the callee
stores k, v of the new token (position = its cache length) before attending."""


class NumpyDecoder:
    window: Optional[int] = None   # keys a sliding-window ("local") layer sees
    report_every = 10              # prefill progress line every this many layers

    def layer_window(self, L: dict) -> Optional[int]:
        return self.window if L.get("local") else None

    def prefill(self, ids: Sequence[int], past=None, chunk: int = 256, verbose: bool = False):
        """Runs tokens densely (causal). `past` = (K list, V list) of earlier
        positions continues a previous prefill. Returns (logits of the last position
        [vocab], K list [layer] of [P + T, n_kv, d] post-RoPE, V list likewise); K/V
        of every position are returned for every layer, sliding-window layers only
        attend to the last `window` of them."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        P = 0 if past is None else past[0][0].shape[0]
        x = self.embed_tokens(ids)
        pos = np.arange(P, P + T)
        Ks, Vs = [], []
        t0 = time.time()
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["attn_norm"])
            q, k, v = self._qkv(L, h, pos)
            if past is not None:
                k = np.concatenate([past[0][li], k], 0)
                v = np.concatenate([past[1][li], v], 0)
            Ks.append(k)
            Vs.append(v)
            attn = causal_attention(q, k, v, P, chunk, self.layer_window(L))
            x = x + self._attn_out(L, attn.reshape(T, self.n_q * self.head_dim))
            x = x + self._mlp(L, x)
            if verbose and ((li + 1) % self.report_every == 0 or li == len(self.layers) - 1):
                print("  prefill %d tokens (+%d cached): layer %d/%d (%.0fs)" % (
                    T, P, li + 1, len(self.layers), time.time() - t0), flush=True)
        return self.logits(x[-1]), Ks, Vs

    def step(self, token: int, position: int, attend: AttnFn) -> np.ndarray:
        """Feeds one token at `position`; attend(layer, q, k, v) must append k, v to
        that layer's cache and return the attention output over it (over the last
        `window` positions on sliding-window layers). Returns logits."""
        x = self.embed_tokens([token])
        pos = np.array([position])
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["attn_norm"])
            q, k, v = self._qkv(L, h, pos)
            o = attend(li, np.ascontiguousarray(q[0]), np.ascontiguousarray(k[0]), np.ascontiguousarray(v[0]))
            x = x + self._attn_out(L, o.reshape(1, self.n_q * self.head_dim))
            x = x + self._mlp(L, x)
        return self.logits(x[0])


class NumpyCache:
    """Dense decode attention in numpy over a growing per-layer cache (the
    reference); sliding-window layers see only the last `window` positions."""

    def __init__(self, model: NumpyDecoder, Ks, Vs):
        self.m = model
        self.K = list(Ks)
        self.V = list(Vs)

    def __call__(self, layer, q, k, v):
        self.K[layer] = np.concatenate([self.K[layer], k[None]], 0)
        self.V[layer] = np.concatenate([self.V[layer], v[None]], 0)
        K, V = self.K[layer], self.V[layer]
        w = self.m.layer_window(self.m.layers[layer])
        if w:
            K, V = K[-w:], V[-w:]
        return dense_attention(q, K, V)
