"""Time per generated token through transformers' generate, SSA through ssa.hf
against transformers' own sdpa decode, on a CUDA device.

The model has Llama-3.1-8B's attention and MLP shape (hidden 4096, 32 query heads,
8 KV heads, head dim 128, MLP 14336, bf16) with randomly initialised weights and
--layers layers (the time per token of every layer is the same work). The cache is
filled with N - 1 random keys and values per layer (what a prefill would leave;
the decode's cost does not depend on how they got there), then generate() runs on
an N-token prompt, so it processes the last prompt token and M new ones. The time
per token is (time for M + 1 steps - time for 1 step) / M, median of --reps.
The share of a step's GPU kernel time spent in libssa's kernels comes from the
torch profiler (CUPTI sees every kernel on the device).

  python3 bench/hf_decode_bench.py [--contexts 32768,131072,524288] [--layers 4] [--steps 32]
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


def make_model(attn, layers):
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                                   head_dim=128, max_position_embeddings=1 << 21, initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn,
                                                              dtype=torch.bfloat16)
    return model.eval()


def fill(cache, layers, n, gen):
    for layer in range(layers):
        k = torch.randn(1, 8, n, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, 8, n, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
        cache.update(k, v, layer, {"cache_position": torch.arange(n, device="cuda")})
        if isinstance(cache, ssa.hf.SSACache):
            # What the prefill's attention call would append, without computing the
            # prefill's attention (the "ssa" attention takes this hand-over).
            work = ssa.hf._attention.take_pending(layer)
            cache._append(work.layer, 0, k[0], v[0], None)
    torch.cuda.synchronize()


def timed_generate(model, ids, make_cache, steps):
    cache = make_cache()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, past_key_values=cache, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def kernel_share(model, ids, make_cache, steps):
    """Share of the GPU kernel time of `steps` generate steps in libssa's kernels."""
    cache = make_cache()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model.generate(ids, past_key_values=cache, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        torch.cuda.synchronize()
    total = ours = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = e.device_time if hasattr(e, "device_time") else e.cuda_time
            total += t
            if e.name.startswith("ssa::") or "ssa::" in e.name[:40]:
                ours += t
    return ours / total if total else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="32768,131072,524288")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sparsity", type=float, default=50.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    print("# ssa.hf decode through generate on %s, torch %s, transformers %s, libssa %s" %
          (torch.cuda.get_device_name(), torch.__version__, transformers.__version__, ssa.version()))
    print("# Llama-3.1-8B shape, %d layers, bf16, batch 1; SSA %gx vs sdpa\n" % (a.layers, a.sparsity))
    print("| N | sdpa ms/token | SSA ms/token | speed-up | libssa share of SSA step's kernel time | sdpa cache |")
    print("|---|---|---|---|---|---|")
    rows = []
    models = {"sdpa": make_model("sdpa", a.layers), "ssa": make_model("ssa", a.layers)}
    for n in [int(x) for x in a.contexts.split(",")]:
        gen = torch.Generator(device="cuda").manual_seed(n)
        ids = torch.randint(0, 32000, (1, n), device="cuda", generator=gen)
        # transformers' sdpa decode on its static cache (preallocated: no copy of the
        # whole cache per step, which its dynamic cache would make), else the dynamic one.
        try:
            static = transformers.StaticCache(config=models["sdpa"].config, max_cache_len=n + a.steps + 2)
            del static
            kind = "static"
        except Exception:  # noqa: BLE001 - an older or newer signature
            kind = "dynamic"

        def sdpa_cache():
            c = (transformers.StaticCache(config=models["sdpa"].config, max_cache_len=n + a.steps + 2)
                 if kind == "static" else transformers.DynamicCache())
            fill(c, a.layers, n - 1, torch.Generator(device="cuda").manual_seed(7))
            return c

        def ssa_cache():
            c = ssa.hf.SSACache(models["ssa"], method="ssa", sparsity=a.sparsity)
            fill(c, a.layers, n - 1, torch.Generator(device="cuda").manual_seed(7))
            return c

        res = {}
        for name, mk in (("sdpa", sdpa_cache), ("ssa", ssa_cache)):
            m = models[name]
            timed_generate(m, ids, mk, 2)  # warm-up
            per = []
            for _ in range(a.reps):
                t_many = timed_generate(m, ids, mk, a.steps + 1)
                t_one = timed_generate(m, ids, mk, 1)
                per.append((t_many - t_one) / a.steps * 1e3)
            res[name] = statistics.median(per)
            torch.cuda.empty_cache()
        share = kernel_share(models["ssa"], ids, ssa_cache, 8)
        row = dict(n=n, sdpa_ms=res["sdpa"], ssa_ms=res["ssa"], speedup=res["sdpa"] / res["ssa"],
                   libssa_kernel_share=share, sdpa_cache=kind, layers=a.layers, sparsity=a.sparsity)
        rows.append(row)
        print("| %d | %.2f | %.2f | %.2fx | %.0f%% | %s |" % (n, res["sdpa"], res["ssa"], row["speedup"], 100 * share,
                                                             kind))
        sys.stdout.flush()
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
