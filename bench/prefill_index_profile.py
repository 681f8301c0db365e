"""Where a prefill's time goes in libssa on a CUDA device: for a 32-layer
Llama-3.1-8B-shaped session (8 KV heads, head dim 128, bf16), the K/V a prefill of
N tokens leaves are appended layer by layer (device tensors on torch's stream), as
SSACache does during a prefill, and timed three ways:
  append+index   the default policy: each layer's index trained when its append
                 reaches index_min_tokens (on the prefill's critical path);
  append only    index_min_tokens above N: no training;
  index only     ssa_session_update_index on the filled session (every layer),
                 once per proxy of --proxies; the query-aware ones (qpq, qpq4) are
                 first shown 256 random queries per layer, as ssa.hf shows them a
                 prefill's last queries, so that they learn transforms and key weights.
What the appends may cost is set by transformers' sdpa prefill of the model (its
time to first token, about 1.36 s at 32K on the H200): SSA's must stay within 1.15x.

  python3 bench/prefill_index_profile.py [--contexts 32768,131072] [--layers 32] [--proxies pq,qpq,qpq4]

The training's kernels one by one (gather_kernel, seed_kernel, assign_accumulate_kernel,
finish_kernel, encode_kernel):
  nsys profile -o /tmp/prefill --stats=true python3 bench/prefill_index_profile.py --contexts 32768 --layers 8
"""
import argparse
import time

import torch

import ssa
from kernel_times import kernel_times  # bench/kernel_times.py


def kv(n, gen):
    return (torch.randn(8, n, 128, generator=gen, device="cuda", dtype=torch.bfloat16).transpose(0, 1).contiguous(),
            torch.randn(8, n, 128, generator=gen, device="cuda", dtype=torch.bfloat16).transpose(0, 1).contiguous())


def fill(rt, layers, data, index_min, proxy="pq"):
    kw = {} if index_min is None else dict(index_min_tokens=index_min)
    if proxy != "pq":
        kw["proxy"] = proxy
        if proxy.endswith("4"):
            kw.update(pq_subspaces=32, pq_centroids=16)
    s = rt.create_session(n_layers=layers, n_q_heads=32, n_kv_heads=8, head_dim=128, dtype="bfloat16", **kw)
    stream = torch.cuda.current_stream()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for layer in range(layers):
        k, v = data[layer % len(data)]
        s.append_async(layer, k, v, stream=stream)
    torch.cuda.synchronize()
    return s, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--proxies", default="pq")
    ap.add_argument("--profile", action="store_true",
                    help="also print the GPU time by kernel of each proxy's update_index (torch.profiler)")
    a = ap.parse_args()
    rt = ssa.Runtime(backend="cuda")
    proxies = a.proxies.split(",")
    print("| N | layers | append+index s | append only s | " + " | ".join(
        "index only s (%s) | per layer" % p for p in proxies) + " |")
    print("|---|---|---|---|" + "---|---|" * len(proxies))
    for n in [int(x) for x in a.contexts.split(",")]:
        gen = torch.Generator(device="cuda").manual_seed(n)
        data = [kv(n, gen) for _ in range(4)]  # 4 distinct layers' K/V, reused
        queries = torch.randn(256, 32, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
        fill(rt, 2, data, None)[0].close()  # warm-up
        s, t_both = fill(rt, a.layers, data, None)
        s.close()
        index = []
        for proxy in proxies:
            s, t_app = fill(rt, a.layers, data, 1 << 31, proxy)
            if proxy.startswith("qpq"):
                for layer in range(a.layers):
                    s.observe_queries(layer, queries)
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            s.update_index()
            torch.cuda.synchronize()
            index.append(time.perf_counter() - t0)
            s.close()
            if a.profile:
                s, _ = fill(rt, a.layers, data, 1 << 31, proxy)
                if proxy.startswith("qpq"):
                    for layer in range(a.layers):
                        s.observe_queries(layer, queries)
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    t0 = time.perf_counter()
                    s.update_index()
                    torch.cuda.synchronize()
                    wall = time.perf_counter() - t0
                s.close()
                kernels = kernel_times(prof)
                busy = sum(v[0] for v in kernels.values()) / 1e3
                print("# %s N=%d: %.1f ms wall (profiled), GPU busy %.1f ms, over %d layers; by kernel (ms, calls):"
                      % (proxy, n, wall * 1e3, busy, a.layers))
                for name, (us, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:8]:
                    print("#   %8.2f %5d  %s" % (us / 1e3, calls, name[:100]))
        print("| %d | %d | %.3f | %.3f | " % (n, a.layers, t_both, t_app) +
              " | ".join("%.3f | %.4f" % (t, t / a.layers) for t in index) + " |")
        del data
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
