"""Shared pieces of the fidelity evaluation and the demo: thread limits, a disk
cache of dense prefills, libssa sessions holding a prefill, and one decode run
whose attention is served by libssa."""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import hashlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Dict, List, Optional, Sequence  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smollm  # noqa: E402
from attention_ref import dense_attention  # noqa: E402,F401  (also used as common.dense_attention)

MODELS = ["smollm2", "gemma3"]


def load_model(name: str = "smollm2"):
    """smollm2: SmolLM2-135M-Instruct (eval/smollm.py); gemma3: Gemma-3-270M
    (eval/gemma3.py)."""
    if name == "smollm2":
        return smollm.SmolLM()
    if name == "gemma3":
        import gemma3
        return gemma3.Gemma3()
    raise ValueError(name)


def ssa_layers(model) -> List[int]:
    """The layers whose decode attention libssa serves: all of them, or only the
    global ones of a model with sliding-window layers (model.global_layers)."""
    g = getattr(model, "global_layers", None)
    return list(g) if g is not None else list(range(model.n_layers))


def local_windows(model, K, V) -> Dict[int, tuple]:
    """For sliding-window layers: the last window - 1 K/V rows of the prefill, which
    the next decoded token sees besides itself (decoded densely in numpy)."""
    if getattr(model, "global_layers", None) is None:
        return {}
    w = model.window - 1
    return {l: (np.array(K[l][-w:]), np.array(V[l][-w:])) for l in range(model.n_layers)
            if l not in model.global_layers}

METHODS = ["dense", "pq_topk", "oracle_topk", "hybrid_uniform", "ssa", "ssa_adaptive"]
SPARSITIES = [5, 10, 20, 50]
HEAVY_FRACTION = 0.4
SEED = 1234
CACHE_DIR = os.environ.get("SSA_EVAL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "libssa-eval"))


def sink_local(n_ctx: int) -> int:
    """Always-read sink and local tokens (each), scaled to the context: N/256,
    at least 8 (32 + 32 at 8K, 16 + 16 at 4K)."""
    return max(8, int(round(n_ctx / 256.0)))


def runtime(backend: str = "cpu"):
    import ssa
    return ssa.Runtime(backend=backend, threads=1, seed=1)


def cached_prefill(model: smollm.SmolLM, ids: Sequence[int], past_ids: Optional[Sequence[int]] = None,
                   verbose: bool = True):
    """Dense prefill of ids, cached on disk by the token ids. If past_ids (a
    prefix of ids) has a cached prefill, only the rest is computed."""
    os.makedirs(CACHE_DIR, exist_ok=True)

    def key(t):
        return hashlib.sha1(np.asarray(t, dtype=np.int32).tobytes()).hexdigest()[:20]

    tag = getattr(model, "cache_tag", "")
    path = os.path.join(CACHE_DIR, "prefill-%s%s.npz" % (tag, key(ids)))
    if os.path.exists(path):
        z = np.load(path)
        return z["logits"], list(z["K"]), list(z["V"])
    t0 = time.time()
    past = None
    n_past = 0
    if past_ids is not None:
        assert list(ids[: len(past_ids)]) == list(past_ids)
        _, pk, pv = cached_prefill(model, past_ids, verbose=verbose)
        past, n_past = (pk, pv), len(past_ids)
    logits, K, V = model.prefill(ids[n_past:], past=past, verbose=verbose)
    np.savez(path, logits=logits, K=np.stack(K), V=np.stack(V))
    if verbose:
        print("prefill of %d tokens (%d reused): %.0fs" % (len(ids), n_past, time.time() - t0), flush=True)
    return logits, K, V


def build_session(rt, model: smollm.SmolLM, K, V, dtype: str = "float32", host_pointers: bool = False):
    """A libssa session holding the prefill's post-RoPE K and V of every layer
    libssa serves (ssa_layers: session layer i is model layer ssa_layers[i]).
    The PQ index (16 subspaces of head_dim / 16 dims, 256 centroids) trains on append.
    host_pointers: a CUDA session that takes the numpy arrays of this model."""
    layers = ssa_layers(model)
    s = rt.create_session(n_layers=len(layers), n_q_heads=model.n_q, n_kv_heads=model.n_kv,
                          head_dim=model.head_dim, dtype=dtype, pq_subspaces=16, host_pointers=host_pointers)
    np_dt = np.float32 if dtype == "float32" else np.float16
    for i, layer in enumerate(layers):
        s.append(i, np.ascontiguousarray(K[layer], dtype=np_dt), np.ascontiguousarray(V[layer], dtype=np_dt))
    return s


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def run_decode(model: smollm.SmolLM, base, pos0: int, logits0: np.ndarray, feed: Sequence[int],
               method: str, sparsity: float, n_sink: int, n_local: int, n_generate: int = 0,
               ref_every: int = 0, stop=None, dtype: str = "float32", decode_kw: Optional[Dict] = None,
               head_errors: bool = False, local: Optional[Dict[int, tuple]] = None) -> Dict:
    """Feeds `feed` (teacher forcing) from position pos0 on a fork of `base`, then
    generates n_generate tokens greedily; every decode-time attention is
    session.decode(layer, q, method=..., **decode_kw). Records, for each logit
    vector produced by a decode step: its argmax, and for forced steps the
    log-probability of the next forced token. With ref_every > 0, every
    ref_every-th step also decodes DENSE on the same session and query and records
    the relative L2 error of the attention output per layer (per head, then
    averaged), and with head_errors every single (layer, head) error.
    local: {layer: (K, V)} of sliding-window layers (local_windows): these are
    decoded densely in numpy over the last model.window positions, not by libssa,
    and have no error entry; the session holds only ssa_layers(model).
    """
    np_dt = np.float32 if dtype == "float32" else np.float16
    s = base.fork()
    n_layers, n_q = model.n_layers, model.n_q
    err_sum = np.zeros(n_layers)
    err_n = np.zeros(n_layers)
    st_tot = dict(tokens_read=0, context=0, calls=0, target_budget=0, capped=0, predicted=0.0)
    state = dict(step=0, ref=False)
    per_head: List[List[float]] = []  # [layer, step, e_head0, e_head1, ...] rows
    kw = dict(decode_kw or {})
    smap = {l: i for i, l in enumerate(ssa_layers(model))}
    win = {l: (K.copy(), V.copy()) for l, (K, V) in (local or {}).items()}

    def attend(layer, q, k, v):
        if layer in win:
            K, V = win[layer]
            K = np.concatenate([K, k[None]], 0)[-model.window:]
            V = np.concatenate([V, v[None]], 0)[-model.window:]
            win[layer] = (K, V)
            return dense_attention(q, K, V).astype(np.float32)
        sl = smap[layer]
        s.append(sl, np.ascontiguousarray(k[None], dtype=np_dt), np.ascontiguousarray(v[None], dtype=np_dt))
        qq = np.ascontiguousarray(q, dtype=np_dt)
        out, st = s.decode(sl, qq, method=method, sparsity=sparsity, heavy_fraction=HEAVY_FRACTION,
                           n_sink=n_sink, n_local=n_local, seed=SEED, step=state["step"], stats=True, **kw)
        st_tot["tokens_read"] += st.tokens_read
        st_tot["context"] += st.context_tokens * n_q
        st_tot["calls"] += 1
        st_tot["target_budget"] += st.target_budget
        st_tot["capped"] += st.capped_heads
        st_tot["predicted"] += st.predicted_error
        if state["ref"]:
            ref = s.decode(sl, qq, method="dense").astype(np.float64)
            o = out.astype(np.float64)
            e = np.linalg.norm(o - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
            err_sum[layer] += e.mean()
            err_n[layer] += 1
            if head_errors:
                per_head.append([layer, state["step"]] + [round(float(x), 6) for x in e])
        return out.astype(np.float32)

    t0 = time.time()
    preds: List[int] = []
    logps: List[float] = []
    generated: List[int] = []
    logits = logits0
    pos = pos0
    for j, tok in enumerate(feed):
        state["ref"] = ref_every > 0 and method != "dense" and j % ref_every == 0
        logits = model.step(tok, pos, attend)
        pos += 1
        state["step"] += 1
        if j + 1 < len(feed):
            preds.append(int(np.argmax(logits)))
            logps.append(float(log_softmax(logits)[feed[j + 1]]))
    state["ref"] = False
    for _ in range(n_generate):
        tok = int(np.argmax(logits))
        generated.append(tok)
        if stop is not None and stop(generated):
            break
        logits = model.step(tok, pos, attend)
        pos += 1
        state["step"] += 1
    elapsed = time.time() - t0
    s.close()
    with np.errstate(invalid="ignore"):
        err = np.where(err_n > 0, err_sum / np.maximum(err_n, 1), np.nan)
    return dict(method=method, sparsity=sparsity, preds=preds, logps=logps, generated=generated,
                layer_err=[None if np.isnan(x) else float(x) for x in err],
                read_fraction=st_tot["tokens_read"] / max(st_tot["context"], 1),
                tokens_read_per_step=st_tot["tokens_read"] / max(state["step"], 1),
                budget_fraction=st_tot["target_budget"] / max(st_tot["context"], 1),
                capped_heads=st_tot["capped"], head_decodes=st_tot["calls"] * n_q,
                predicted_error_mean=st_tot["predicted"] / max(st_tot["calls"] * n_q, 1),
                head_errors=per_head if head_errors else None,
                steps=state["step"], seconds=elapsed)
