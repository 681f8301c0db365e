"""The loop a user runs: time per generated token and time to first token through
transformers' generate, on a CUDA device, for SSA through ssa.hf against
transformers' own sdpa paths, with the bounds that explain them measured in the
same run.

The model has Llama-3.1-8B's shape (hidden 4096, 32 query heads, 8 KV heads, head
dim 128, MLP 14336, bf16) with random weights and --layers layers (32: the whole
model). Per (context N, batch B):
  sdpa-default    transformers' DynamicCache (eager);
  sdpa-static     transformers' StaticCache, which generate compiles (CUDA graphs);
  ssa-eager       ssa.hf.SSACache at --sparsity, generate(disable_compile=True);
  ssa-compiled    SSACache on generate's compiled path (CUDA graphs; libssa's step
                  enters them as the custom op torch.ops.ssa.decode_step);
and, once per batch, the non-attention floor (sdpa-static at a --floor-context
context). The cache holds N - 1 random keys and values per layer (what a prefill
leaves; the decode's cost does not depend on how they got there; an SSACache is
filled once and forked for every run), then generate() gets an N-token prompt:
it processes the last prompt token and M new ones. Time per token is the median
time between consecutive tokens after the first 4 of each call (a new cache records
new CUDA graphs there), over --reps calls.
Kernel times per step: libssa's (its kernels' device time over generate's steps,
from the torch profiler), and the best dense decode attention (torch SDPA with
GQA on one [B, 32, 1, 128] query over N keys, CUDA events) times the layers; an
ideal dense engine is the floor plus that.
Time to first token (--ttft contexts, batch 1): generate(max_new_tokens=1) on an
N-token prompt from an empty cache, prefill included (SSACache: its appends; its
index is trained at the first decode step, so the time to the second token is
reported beside it).

  python3 bench/hf_decode_bench.py [--contexts 32768,131072,524288] [--batches 1,4] [--layers 32]
      [--paths sdpa-default,sdpa-static,ssa-eager,ssa-compiled] [--ttft 32768,131072] [--proxy pq] [--json out.json]
"""
import argparse
import gc
import json
import statistics
import sys
import time

import torch
import transformers

import ssa
import ssa.hf

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def make_model(attn, layers):
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                   head_dim=HEAD_DIM, max_position_embeddings=1 << 21, initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16)
    return model.eval()


def fill(cache, layers, n, batch, seed):
    """N random K/V per layer and row, as a prefill of n tokens leaves them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for layer in range(layers):
        k = torch.randn(batch, KV_HEADS, n, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, KV_HEADS, n, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
        if isinstance(cache, ssa.hf.SSACache):
            cache.append_kv(layer, k, v)  # what the prefill leaves, without its attention
        else:
            cache.update(k, v, layer, {"cache_position": torch.arange(n, device="cuda")})
        del k, v
    torch.cuda.synchronize()
    return cache


class StepClock(transformers.StoppingCriteria):
    """The time at which each step's token is known (generate waits for it anyway)."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores, **kwargs):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def timed_generate(model, ids, cache, steps, compiled):
    """Seconds of generate(steps tokens), and the times at which each token came."""
    clock = StepClock()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, past_key_values=cache, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                   pad_token_id=0, disable_compile=not compiled, stopping_criteria=[clock])
    torch.cuda.synchronize()
    return time.perf_counter() - t0, [t - t0 for t in clock.times]


WARM_STEPS = 4  # the first steps of a generate call (a new cache: a CUDA graph recorded for it)


def per_token_ms(model, ids, make_cache, steps, reps, compiled):
    """Median ms between consecutive tokens, over the steps after the first
    WARM_STEPS of each of reps generate calls, each on a new cache."""
    timed_generate(model, ids, make_cache(), WARM_STEPS + 2, compiled)  # warm-up (and compilation)
    per = []
    for _ in range(reps):
        _, times = timed_generate(model, ids, make_cache(), WARM_STEPS + steps + 1, compiled)
        per += [(b - a) * 1e3 for a, b in zip(times[WARM_STEPS:], times[WARM_STEPS + 1:])]
    return statistics.median(per)


def libssa_kernel_ms(model, ids, make_cache, steps):
    """libssa's kernels' device time per generated token (torch profiler / CUPTI),
    from the eager path, which runs the same kernels as the compiled one."""
    cache = make_cache()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model.generate(ids, past_key_values=cache, max_new_tokens=steps + 1, min_new_tokens=steps + 1,
                       do_sample=False, pad_token_id=0, disable_compile=True)
        torch.cuda.synchronize()
    ours = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "ssa::" in e.name:
            ours += e.device_time if hasattr(e, "device_time") else e.cuda_time
    return ours / 1e3 / (steps + 1)


def dense_kernel_ms(n, batch, layers, reps=20):
    """The best dense decode attention we can run here: torch SDPA (flash/cuDNN
    backends as torch picks) on one query over n keys, GQA, per step of `layers`."""
    q = torch.randn(batch, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, KV_HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    f = torch.nn.functional.scaled_dot_product_attention
    for _ in range(3):
        f(q, k, v, enable_gqa=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        f(q, k, v, enable_gqa=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del q, k, v
    return statistics.median(times) * layers


def ttft_s(model, ids, make_cache, compiled):
    """Seconds to the first and to the second token from an empty cache."""
    cache = make_cache()
    _, times = timed_generate(model, ids, cache, 2, compiled)
    return times[0], times[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="32768,131072,524288")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sparsity", type=float, default=50.0)
    ap.add_argument("--paths", default="sdpa-default,sdpa-static,ssa-eager,ssa-compiled")
    ap.add_argument("--floor-context", type=int, default=4096)
    ap.add_argument("--ttft", default="32768,131072", help="contexts for time to first token ('' = none)")
    ap.add_argument("--max-default-tokens", type=int, default=1 << 18,
                    help="sdpa-default only up to this many tokens x batch (its cache copies itself per step)")
    ap.add_argument("--max-tokens", type=int, default=1 << 20,
                    help="(context x batch) above this is skipped: its K/V would not fit beside the model")
    ap.add_argument("--proxy", default=None, help="SSACache(proxy=); default ssa.hf's")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    paths = a.paths.split(",")
    L = a.layers
    print("# generate on %s, torch %s, transformers %s, libssa %s; Llama-3.1-8B shape, %d layers, bf16, SSA %gx" %
          (torch.cuda.get_device_name(), torch.__version__, transformers.__version__,
           ".".join(map(str, ssa.version())), L, a.sparsity))
    # One model: its attention switched between transformers' sdpa and "ssa".
    model = make_model("ssa", L)

    def use(attn):
        model.set_attn_implementation(attn)
        return model

    rows = []

    def static_cache(n, batch, steps):
        c = transformers.StaticCache(config=model.config, max_cache_len=n + steps + WARM_STEPS + 4)
        return fill(c, L, n - 1, batch, 7)

    def ssa_cache():
        return ssa.hf.SSACache(use("ssa"), method="ssa", sparsity=a.sparsity, proxy=a.proxy)

    floors = {}
    for batch in [int(x) for x in a.batches.split(",")]:
        n = a.floor_context
        ids = torch.randint(1, 32000, (batch, n), device="cuda")
        floors[batch] = per_token_ms(use("sdpa"), ids, lambda: static_cache(n, batch, a.steps), a.steps, a.reps,
                                     True)
        print("# non-attention floor, batch %d (sdpa-static at %d tokens): %.2f ms/token" % (batch, n, floors[batch]))
        torch.cuda.empty_cache()
    print()
    print("| N | batch | sdpa-default | sdpa-static | ssa-eager | ssa-compiled | floor | libssa kernels | "
          "dense kernel x L | ideal dense | ssa-compiled vs sdpa-static | vs ideal dense | vs floor+kernels |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.contexts.split(",")]:
        for batch in [int(x) for x in a.batches.split(",")]:
            if n * batch > a.max_tokens:
                print("| %d | %d | (K/V of %d tokens: skipped, --max-tokens %d) |" % (n, batch, n * batch,
                                                                                      a.max_tokens))
                continue
            ids = torch.randint(1, 32000, (batch, n), device="cuda")
            res = {}
            kern = None
            if "ssa-eager" in paths or "ssa-compiled" in paths:
                base = fill(ssa_cache(), L, n - 1, batch, 7)
                base.prepare_step()  # trains the index once (a prefill's first decode would), shared by the forks
                if "ssa-eager" in paths:
                    res["ssa-eager"] = per_token_ms(use("ssa"), ids, base.fork, a.steps, a.reps, False)
                kern = libssa_kernel_ms(use("ssa"), ids, base.fork, 8)
                if "ssa-compiled" in paths:
                    res["ssa-compiled"] = per_token_ms(use("ssa"), ids, base.fork, a.steps, a.reps, True)
                del base
                gc.collect()  # caches and their layers refer to each other: freed by the collector
                torch.cuda.empty_cache()
            if "sdpa-default" in paths and n * batch <= a.max_default_tokens:
                res["sdpa-default"] = per_token_ms(use("sdpa"), ids,
                                                   lambda: fill(transformers.DynamicCache(), L, n - 1, batch, 7),
                                                   a.steps, a.reps, False)
                torch.cuda.empty_cache()
            if "sdpa-static" in paths:
                res["sdpa-static"] = per_token_ms(use("sdpa"), ids, lambda: static_cache(n, batch, a.steps),
                                                  a.steps, a.reps, True)
                gc.collect()
                torch.cuda.empty_cache()
            dense = dense_kernel_ms(n, batch, L)
            ideal = floors[batch] + dense
            ssa_ms = res.get("ssa-compiled", res.get("ssa-eager"))
            row = dict(n=n, batch=batch, layers=L, sparsity=a.sparsity, floor_ms=floors[batch], libssa_kernel_ms=kern,
                       dense_kernel_ms=dense, ideal_dense_ms=ideal, **{k.replace("-", "_") + "_ms": v
                                                                         for k, v in res.items()})
            rows.append(row)

            def f(k):
                return "%.2f" % res[k] if k in res else "n/a"

            vs_static = "%.2fx" % (res["sdpa-static"] / ssa_ms) if ssa_ms and "sdpa-static" in res else "n/a"
            vs_ideal = "%.2fx" % (ideal / ssa_ms) if ssa_ms else "n/a"
            overhead = "%.2fx" % (ssa_ms / (floors[batch] + kern)) if ssa_ms and kern is not None else "n/a"
            print("| %d | %d | %s | %s | %s | %s | %.2f | %s | %.2f | %.2f | %s | %s | %s |" % (
                n, batch, f("sdpa-default"), f("sdpa-static"), f("ssa-eager"), f("ssa-compiled"), floors[batch],
                "%.2f" % kern if kern is not None else "n/a", dense, ideal, vs_static, vs_ideal, overhead))
            sys.stdout.flush()
    if a.ttft:
        print("\n| N | TTFT sdpa s | TTFT SSACache s | ratio | 2nd token sdpa s | 2nd token SSACache s |")
        print("|---|---|---|---|---|---|")
        for n in [int(x) for x in a.ttft.split(",")]:
            ids = torch.randint(1, 32000, (1, n), device="cuda")
            ttft_s(use("sdpa"), ids[:, :1024], transformers.DynamicCache, False)  # warm-up
            t_sdpa = ttft_s(use("sdpa"), ids, transformers.DynamicCache, False)
            torch.cuda.empty_cache()
            ttft_s(use("ssa"), ids[:, :1024], ssa_cache, True)  # warm-up
            t_ssa = ttft_s(use("ssa"), ids, ssa_cache, True)
            torch.cuda.empty_cache()
            rows.append(dict(n=n, ttft_sdpa_s=t_sdpa[0], ttft_ssa_s=t_ssa[0], second_sdpa_s=t_sdpa[1],
                             second_ssa_s=t_ssa[1]))
            print("| %d | %.2f | %.2f | %.2fx | %.2f | %.2f |" % (n, t_sdpa[0], t_ssa[0], t_ssa[0] / t_sdpa[0],
                                                               t_sdpa[1], t_ssa[1]))
            sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
