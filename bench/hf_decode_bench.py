"""The loop a user runs: time per generated token and time to first token through
transformers' generate, on a CUDA device, for SSA through ssa.hf against
transformers' own sdpa paths, with the bounds that explain them measured in the
same run.

The model has Llama-3.1-8B's shape (hidden 4096, 32 query heads, 8 KV heads, head
dim 128, MLP 14336, bf16) with random weights and --layers layers (32: the whole
model). Per (context N, batch B):
  sdpa-default    transformers' DynamicCache (eager);
  sdpa-static     transformers' StaticCache, which generate compiles (CUDA graphs);
  ssa-eager       ssa.hf.SSACache at --sparsity;
  ssa-compiled    SSACache on generate's compiled path, where SSACache is
                  compileable (else "n/a");
and, once per batch, the non-attention floor (sdpa-static at a --floor-context
context). The cache holds N - 1 random keys and values per layer (what a prefill
leaves; the decode's cost does not depend on how they got there; an SSACache is
filled once and forked for every run), then generate() gets an N-token prompt:
it processes the last prompt token and M new ones. Time per token is
(time for M + 1 steps - time for 1 step) / M, median of --reps.
Kernel times per step: libssa's (its kernels' device time over generate's steps,
from the torch profiler), and the best dense decode attention (torch SDPA with
GQA on one [B, 32, 1, 128] query over N keys, CUDA events) times the layers; an
ideal dense engine is the floor plus that.
Time to first token (--ttft contexts, batch 1): generate(max_new_tokens=1) on an
N-token prompt from an empty cache, prefill included (SSACache: its appends and
index training too).

  python3 bench/hf_decode_bench.py [--contexts 32768,131072,524288] [--batches 1,4] [--layers 32]
      [--paths sdpa-default,sdpa-static,ssa-eager,ssa-compiled] [--ttft 32768,131072] [--json out.json]
"""
import argparse
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
        cache.update(k, v, layer, {"cache_position": torch.arange(n, device="cuda")})
        if isinstance(cache, ssa.hf.SSACache):
            # What the prefill's attention call would append, without computing the
            # prefill's attention (the "ssa" attention takes this hand-over).
            work = ssa.hf._attention.take_pending(layer)
            for b in range(batch):
                cache._append(work.layer, b, k[b], v[b], None)
            work.layer.dense_k = work.layer.dense_v = None
        del k, v
    torch.cuda.synchronize()
    return cache


def timed_generate(model, ids, cache, steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, past_key_values=cache, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                   pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def per_token_ms(model, ids, make_cache, steps, reps):
    timed_generate(model, ids, make_cache(), 2)  # warm-up (and compilation)
    per = []
    for _ in range(reps):
        t_many = timed_generate(model, ids, make_cache(), steps + 1)
        t_one = timed_generate(model, ids, make_cache(), 1)
        per.append((t_many - t_one) / steps * 1e3)
    return statistics.median(per)


def libssa_kernel_ms(model, ids, make_cache, steps):
    """libssa's kernels' device time per generated token (torch profiler / CUPTI)."""
    cache = make_cache()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model.generate(ids, past_key_values=cache, max_new_tokens=steps + 1, min_new_tokens=steps + 1,
                       do_sample=False, pad_token_id=0)
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


def ttft_s(model, ids, make_cache):
    cache = make_cache()
    return timed_generate(model, ids, cache, 1)


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
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    paths = a.paths.split(",")
    L = a.layers
    print("# generate on %s, torch %s, transformers %s, libssa %s; Llama-3.1-8B shape, %d layers, bf16, SSA %gx" %
          (torch.cuda.get_device_name(), torch.__version__, transformers.__version__,
           ".".join(map(str, ssa.version())), L, a.sparsity))
    models = {"sdpa": make_model("sdpa", L), "ssa": make_model("ssa", L)}
    compileable = getattr(ssa.hf.SSACache, "is_compileable", False)
    rows = []

    def static_cache(n, batch, steps):
        c = transformers.StaticCache(config=models["sdpa"].config, max_cache_len=n + steps + 2)
        return fill(c, L, n - 1, batch, 7)

    floors = {}
    for batch in [int(x) for x in a.batches.split(",")]:
        n = a.floor_context
        ids = torch.randint(1, 32000, (batch, n), device="cuda")
        floors[batch] = per_token_ms(models["sdpa"], ids, lambda: static_cache(n, batch, a.steps), a.steps, a.reps)
        print("# non-attention floor, batch %d (sdpa-static at %d tokens): %.2f ms/token" % (batch, n, floors[batch]))
    print()
    print("| N | batch | sdpa-default | sdpa-static | ssa-eager | ssa-compiled | floor | libssa kernels | "
          "dense kernel x L | ideal dense | ssa-eager vs sdpa-static | vs ideal dense |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.contexts.split(",")]:
        for batch in [int(x) for x in a.batches.split(",")]:
            ids = torch.randint(1, 32000, (batch, n), device="cuda")
            res = {}
            if "sdpa-default" in paths and n * batch <= a.max_default_tokens:
                res["sdpa-default"] = per_token_ms(models["sdpa"], ids,
                                                   lambda: fill(transformers.DynamicCache(), L, n - 1, batch, 7),
                                                   a.steps, a.reps)
                torch.cuda.empty_cache()
            if "sdpa-static" in paths:
                res["sdpa-static"] = per_token_ms(models["sdpa"], ids, lambda: static_cache(n, batch, a.steps),
                                                  a.steps, a.reps)
                torch.cuda.empty_cache()
            kern = None
            if "ssa-eager" in paths or "ssa-compiled" in paths:
                base = fill(ssa.hf.SSACache(models["ssa"], method="ssa", sparsity=a.sparsity), L, n - 1, batch, 7)
                if "ssa-eager" in paths:
                    res["ssa-eager"] = per_token_ms(models["ssa"], ids, base.fork, a.steps, a.reps)
                    kern = libssa_kernel_ms(models["ssa"], ids, base.fork, 8)
                if "ssa-compiled" in paths and compileable:
                    res["ssa-compiled"] = per_token_ms(models["ssa"], ids, base.fork, a.steps, a.reps)
                del base
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
            print("| %d | %d | %s | %s | %s | %s | %.2f | %s | %.2f | %.2f | %s | %s |" % (
                n, batch, f("sdpa-default"), f("sdpa-static"), f("ssa-eager"), f("ssa-compiled"), floors[batch],
                "%.2f" % kern if kern is not None else "n/a", dense, ideal, vs_static, vs_ideal))
            sys.stdout.flush()
    if a.ttft:
        print("\n| N | TTFT sdpa s | TTFT SSACache s | ratio |\n|---|---|---|---|")
        for n in [int(x) for x in a.ttft.split(",")]:
            ids = torch.randint(1, 32000, (1, n), device="cuda")
            ttft_s(models["sdpa"], ids[:, :1024], transformers.DynamicCache)  # warm-up
            t_sdpa = ttft_s(models["sdpa"], ids, transformers.DynamicCache)
            torch.cuda.empty_cache()
            t_ssa = ttft_s(models["ssa"], ids, lambda: ssa.hf.SSACache(models["ssa"], method="ssa",
                                                                        sparsity=a.sparsity))
            torch.cuda.empty_cache()
            rows.append(dict(n=n, ttft_sdpa_s=t_sdpa, ttft_ssa_s=t_ssa))
            print("| %d | %.2f | %.2f | %.2fx |" % (n, t_sdpa, t_ssa, t_ssa / t_sdpa))
            sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
