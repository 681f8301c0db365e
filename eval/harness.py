"""Decoding through transformers with an ssa.hf.SSACache, one method and sparsity
at a time, from a stored dense prefill, with the attention error of every libssa
decode measured against DENSE decode of the same session and query.

The prefill is appended once into a base cache (eval/prefill_store.py); each
method/sparsity runs on base.fork() with its own parameters, so its own K/V
(which depend on its earlier sparse outputs) accumulate as in deployment.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

import equal_rows
import prefill_store

METHODS = ["dense", "oracle_topk", "pq_topk", "hybrid_uniform", "ssa", "ssa_adaptive"]
GROUPS = ["off", "mixture", "mean_query"]
SPARSITIES = [10.0, 20.0, 50.0]
HEAVY_FRACTION = 0.4
SEED = 1234


def sink_local(n_ctx: int) -> int:
    """Always-read sink and local tokens (each), scaled to the context: N/256,
    at least 8 (16 + 16 at 4K, 128 + 128 at 32K)."""
    return max(8, int(round(n_ctx / 256.0)))


def configs(methods: Sequence[str], sparsities: Sequence[float]):
    out = []
    for m in methods:
        out.extend([(m, 1.0)] if m == "dense" else [(m, float(s)) for s in sparsities])
    return out


def group_configs(methods: Sequence[str], sparsities: Sequence[float], groups: Sequence[str]):
    """(method, sparsity, group_selection) triples: DENSE once, every other method
    at every sparsity with each group selection (per-head "off" first)."""
    return [(m, sp, "off" if m == "dense" else g) for m, sp in configs(methods, sparsities)
            for g in (["off"] if m == "dense" else groups)]


class Recorder:
    """The SSACache observer: after each libssa decode, the relative L2 error of
    the output against DENSE decode of the same session and query (per query
    head), and the decode stats. `active` switches the measurement off (for the
    DENSE run itself, whose error is 0 by definition)."""

    def __init__(self):
        self.active = True
        self.trace_log = None   # a trace_log.TraceLog to record every decode's rows into
        self.reset()

    def reset(self):
        self.err: Dict[int, List[List[float]]] = {}   # model layer -> per decode, per head
        self.read = 0
        self.context = 0
        self.calls = 0
        self.distinct = 0       # distinct rows read per KV head, summed (from the traces)
        self.distinct_context = 0
        self.budgets: List[int] = []   # equal-rows group budgets chosen (EqualRowsCache)

    def __call__(self, layer_idx, query, output, stats, cache):
        st = stats[0] if isinstance(stats, (list, tuple)) else stats
        n_q = query.shape[-2]
        self.read += int(st.tokens_read)
        self.context += int(st.context_tokens) * n_q
        self.calls += 1
        traces = getattr(cache, "last_traces", {}).get(int(layer_idx))
        if traces:
            n_kv = cache.shape.n_kv_heads
            self.distinct += sum(equal_rows.kv_unions(traces[0], n_kv))
            self.distinct_context += n_kv * int(st.context_tokens)
            if self.trace_log is not None:
                self.trace_log.add(cache._step, layer_idx, traces[0], st.context_tokens)
        b = getattr(cache, "last_equal_rows_budget", None)
        if b is not None and getattr(cache, "equal_rows_group", "off") != "off":
            self.budgets.append(int(b))
        if not self.active:
            return
        ref = cache.decode_reference(layer_idx, query, method="dense")
        o = output.double().reshape(-1, query.shape[-1])
        r = ref.double().reshape(-1, query.shape[-1])
        e = (o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30)
        self.err.setdefault(int(layer_idx), []).append([round(float(x), 6) for x in e])

    def summary(self) -> Dict:
        layer_err = {l: sum(sum(d) / len(d) for d in v) / len(v) for l, v in self.err.items()}
        # Each query head's mean error over the decodes, per layer (the worst heads
        # show where a selection falls short, which layer means can hide).
        head_err = {str(l): [round(sum(d[h] for d in v) / len(v), 6) for h in range(len(v[0]))]
                    for l, v in sorted(self.err.items()) if v}
        return dict(layer_err={str(l): round(e, 6) for l, e in sorted(layer_err.items())}, head_err=head_err,
                    worst_head_err=max((max(v) for v in head_err.values()), default=0.0),
                    err_mean=round(sum(layer_err.values()) / len(layer_err), 6) if layer_err else 0.0,
                    read_fraction=self.read / max(self.context, 1), libssa_decodes=self.calls,
                    distinct_fraction=(self.distinct / self.distinct_context) if self.distinct_context else None,
                    equal_rows_budget_mean=(sum(self.budgets) / len(self.budgets)) if self.budgets else None)


def make_base(loaded, stored: Dict, recorder: Recorder, n_sl: int, traced: bool = False):
    """The cache holding the stored prefill. traced: an equal_rows.EqualRowsCache
    recording every decode's rows (ssa_decode_traced), for group-selection runs,
    distinct rows read and trace files."""
    import ssa.hf
    kw = dict(method="dense", sparsity=1.0, h=HEAVY_FRACTION, n_sink=n_sl, n_local=n_sl, seed=SEED,
              backend="cpu", observer=recorder)
    if traced:
        cache = equal_rows.make_cache_class()(loaded.model, threads=1, traces=True, **kw)
    else:
        try:
            cache = ssa.hf.SSACache(loaded.model, threads=1, **kw)   # one libssa thread on the shared CPU
        except TypeError:
            cache = ssa.hf.SSACache(loaded.model, **kw)
    prefill_store.into_cache(stored, cache, loaded.model)
    return cache


def fork_for(base, recorder: Recorder, method: str, sparsity: float, group: str = "off"):
    """A fork of the base cache for one configuration. group != "off" (needs a
    traced base): group selection at equal rows read (equal_rows.py)."""
    c = base.fork()
    if getattr(c, "observer", recorder) is not recorder:
        c.observer = recorder
    if group != "off":
        if not hasattr(c, "equal_rows_group"):
            raise ValueError("group selection at equal rows needs make_base(..., traced=True)")
        c.set_params(method=method, sparsity=sparsity, group_selection=group)
        c.equal_rows_group = group
    else:
        c.set_params(method=method, sparsity=sparsity)
    return c


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.double(), dim=-1)


def step(model, cache, tok: int, pos: int) -> torch.Tensor:
    """One decode step: token `tok` at position `pos`; the logits after it."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True,
                    cache_position=torch.tensor([pos]))
    return out.logits[0, -1].float()


def teacher_forced(loaded, cache, pos0: int, logits0: torch.Tensor, feed: Sequence[int]) -> Dict:
    """Feeds `feed` from position pos0; for each of the len(feed) - 1 logit
    vectors that predict a next fed token: its argmax and the log-probability of
    that token. (The logits before feed[0] come from the dense prefill and are
    the same for every method, so they are not scored.)"""
    preds, logps = [], []
    logits = logits0
    for j, tok in enumerate(feed):
        logits = step(loaded.model, cache, int(tok), pos0 + j)
        if j + 1 < len(feed):
            preds.append(int(torch.argmax(logits)))
            logps.append(float(log_softmax(logits)[int(feed[j + 1])]))
    return dict(preds=preds, logps=logps)


def body_step(model, cache, tok: int, pos: int) -> None:
    """A decode step whose logits are not needed: the model body only (every
    layer and its attention through the cache), without the LM head, which is
    most of a step's cost in Gemma-3 (262K-token vocabulary)."""
    with torch.no_grad():
        model.model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True,
                    cache_position=torch.tensor([pos]))


def answer(loaded, cache, pos0: int, question: Sequence[int], max_new: int,
           done: Optional[Callable[[List[int]], bool]] = None,
           give_up: Optional[Callable[[List[int]], bool]] = None) -> Dict:
    """Decodes the question tokens (each through the cache), then up to max_new
    greedy tokens; stops early at EOS, when done(generated) holds (the answer is
    already correct) or when give_up(generated) holds (it can no longer be)."""
    pos = pos0
    for tok in question[:-1]:
        body_step(loaded.model, cache, int(tok), pos)
        pos += 1
    logits = step(loaded.model, cache, int(question[-1]), pos)
    pos += 1
    gen: List[int] = []
    eos = loaded.tok.eos_token_id
    for _ in range(max_new):
        t = int(torch.argmax(logits))
        gen.append(t)
        if t == eos or (done is not None and done(gen)) or (give_up is not None and give_up(gen)):
            break
        logits = step(loaded.model, cache, t, pos)
        pos += 1
    return dict(generated=gen)


def wilson(k: int, n: int, z: float = 1.959964) -> List[float]:
    """95% Wilson score interval of k successes in n trials."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, c - h), 4), round(min(1.0, c + h), 4)]


class Timer:
    def __enter__(self):
        self.t = time.time()
        return self

    def __exit__(self, *a):
        self.s = time.time() - self.t
