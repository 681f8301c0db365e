"""Dense prefills cached on disk, so that each method and sparsity starts from
the same prompt K/V without recomputing it (a 32K-token Gemma-3 prefill takes
many minutes on a CPU).

A prefill runs transformers' own sdpa attention over chunks of the prompt with a
DynamicCache (dense attention, exactly what the "ssa" implementation does for a
prefill) and stores, at each requested checkpoint length n:
  ids     the n prompt token ids
  logits  float32 [vocab], the logits after the last prompt token
  keys / values  per model layer, float32 [1, n_kv, rows, head_dim] as the
          layer's cache holds them: all n rows for full-attention layers,
          the last sliding_window - 1 rows for sliding-window layers.
File: $SSA_EVAL_CACHE (default ~/.cache/libssa-eval)/prefill-<model>-<sha1 of ids>.pt.

`into_cache` feeds a stored prefill into any transformers Cache (an
ssa.hf.SSACache) through Cache.update, as the model's own prefill would: a
sliding layer gets a tensor of all n rows whose first n - (window - 1) rows are
zeros, which its update() drops, so that its position bookkeeping counts n.
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import Dict, List, Sequence

import torch

CACHE_DIR = os.environ.get("SSA_EVAL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "libssa-eval"))


def path_for(model_name: str, ids: Sequence[int]) -> str:
    h = hashlib.sha1(torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes()).hexdigest()[:20]
    return os.path.join(CACHE_DIR, "prefill-%s-%s.pt" % (model_name, h))


def have(model_name: str, ids: Sequence[int]) -> bool:
    return os.path.exists(path_for(model_name, ids))


def compute(loaded, ids: Sequence[int], checkpoints: Sequence[int] = (), chunk: int = 1024,
            verbose: bool = True) -> List[str]:
    """Prefills ids densely (loaded.model must use a dense implementation: sdpa)
    and stores the prefill at every checkpoint length (and at len(ids)).
    Checkpoints already on disk are not recomputed only if all are there."""
    from transformers import DynamicCache
    ids = list(ids)
    cps = sorted(set([n for n in checkpoints if 0 < n < len(ids)] + [len(ids)]))
    paths = [path_for(loaded.name, ids[:n]) for n in cps]
    if all(os.path.exists(p) for p in paths):
        return paths
    os.makedirs(CACHE_DIR, exist_ok=True)
    model = loaded.model
    cache = DynamicCache(config=model.config)
    bounds = sorted(set(list(range(0, len(ids), chunk)) + cps))
    t0 = time.time()
    pos = 0
    logits = None
    with torch.no_grad():
        for end in bounds:
            if end <= pos:
                continue
            x = torch.tensor([ids[pos:end]])
            out = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1,
                        cache_position=torch.arange(pos, end))
            logits = out.logits[0, -1].float().clone()
            pos = end
            if verbose:
                print("  prefill %s: %d / %d tokens, %.0fs" % (loaded.name, pos, len(ids), time.time() - t0),
                      flush=True)
            if pos in cps:
                p = path_for(loaded.name, ids[:pos])
                layers = cache.layers
                torch.save(dict(ids=ids[:pos], logits=logits,
                                keys=[l.keys.clone() for l in layers], values=[l.values.clone() for l in layers],
                                sliding=[bool(getattr(l, "is_sliding", False)) for l in layers],
                                seconds=time.time() - t0), p + ".tmp")
                os.replace(p + ".tmp", p)
    return paths


def load(model_name: str, ids: Sequence[int]) -> Dict:
    return torch.load(path_for(model_name, ids), weights_only=True)


def into_cache(stored: Dict, cache, model) -> None:
    """Appends a stored prefill to an empty cache, layer by layer, as the model's
    own prefill does: the layer's Cache.update, then the model's attention
    function (for an SSACache's full-attention layers, the "ssa" implementation
    stores the K/V in the session there). The attention runs on a one-token
    placeholder query whose output is discarded: the stored prefill already holds
    the real outputs' effect (its logits and the K/V of every layer)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    impl = getattr(model.config, "_attn_implementation", "sdpa")
    attend = ALL_ATTENTION_FUNCTIONS.get(impl) if impl != "sdpa" else None
    n = len(stored["ids"])
    for i, (k, v) in enumerate(zip(stored["keys"], stored["values"])):
        if k.shape[-2] < n:
            pad = n - k.shape[-2]
            k = torch.cat([k.new_zeros(k.shape[:-2] + (pad, k.shape[-1])), k], dim=-2)
            v = torch.cat([v.new_zeros(v.shape[:-2] + (pad, v.shape[-1])), v], dim=-2)
        ks, vs = cache.update(k, v, i, {"cache_position": torch.arange(n)})
        if attend is not None:
            module = model.model.layers[i].self_attn
            n_q = model.config.num_attention_heads
            q = torch.zeros(k.shape[0], n_q, 1, k.shape[-1], dtype=k.dtype)
            attend(module, q, ks, vs, None, dropout=0.0, scaling=getattr(module, "scaling", None))
