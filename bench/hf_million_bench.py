"""A million-token session through transformers on one GPU: generate() with an
ssa.hf.SSACache on a tiered runtime (ssa.Runtime(device_kv_budget=...)).

The model has Llama-3.1-8B's shape (32 layers, hidden 4096, 32 query / 8 KV heads of
128, MLP 14336, bf16) with random weights. The session is filled by appending
--tokens - 1 rows of random K/V per layer, in chunks (what a prefill leaves; a
1M-token prefill of the model takes minutes on any engine), then generate() runs on
a --tokens-token prompt, so it processes the last prompt token and the new ones.

Measured: the fill's rate (appends, the K/V generated on the device before each
timed append; then the PQ index of every layer, trained and encoded, timed apart) beside a pinned host-to-device copy of the same number of bytes in
the same run (a 1 GiB pinned buffer copied over and over), overall and apart for the
layers filled into the device budget and those filled into the host tier; the time
to page-lock the runtime's host pool (--host-pool-gib: ssa.Runtime(host_pool_bytes=),
pinned at creation, off the fill's clock; without it the fill into the host tier
page-locks new memory as it goes, at about 2 GB/s); ms per
generated token ((time of M + 1 steps - time of 1 step) / M) and the steady step (the median
interval between tokens streamed out of generate, its first two intervals left out); rows read from host per
step (DecodeStats.rows_from_host summed over layers, from a separate observed
generate: the observer's waits are not in the timed steps); device memory in use
(cudaMemGetInfo: libssa's allocations included), its peak over the run.

  python3 bench/hf_million_bench.py                       # H200: 1M tokens, 32 layers, 96 GiB budget
  python3 bench/hf_million_bench.py --host-pool-gib 0     # the same, host memory pinned during the fill
  python3 bench/hf_million_bench.py --eager               # generate's eager path (no CUDA graphs)
  python3 bench/hf_million_bench.py --tokens 524288 --device-kv-budget-gib 48 --dense
  python3 bench/hf_million_bench.py --device cpu --shape tiny --tokens 8192 --layers 2 --steps 4   # smoke
"""
import argparse
import json
import time

import torch
import transformers

import ssa
import ssa.hf
from kernel_times import kernel_times  # bench/kernel_times.py

SHAPES = {
    # hidden, intermediate, q heads, kv heads, head dim
    "llama-3.1-8b": (4096, 14336, 32, 8, 128),
    "tiny": (256, 512, 4, 2, 64),
}


def make_model(shape, layers, device, dtype):
    hidden, inter, nq, nkv, d = SHAPES[shape]
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=nq, num_key_value_heads=nkv,
                                   head_dim=d, max_position_embeddings=1 << 21, initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa", dtype=dtype)
    return model.eval()


class DeviceMemory:
    """Device memory in use (total - free, every allocator included) and its peak."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.peak = 0
        self.sample()

    def sample(self):
        if self.cuda:
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
        return self.peak


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def h2d_rate(total, buf=1 << 30):
    """GB/s of pinned host-to-device copies of `total` bytes in all: a buf-byte pinned
    buffer copied into device memory again and again (one synchronisation at the end)."""
    buf = min(buf, total)
    src = torch.empty(buf, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(buf, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    done = 0
    while done < total:
        n = min(buf, total - done)
        dst[:n].copy_(src[:n], non_blocking=True)
        done += n
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    del src, dst
    torch.cuda.empty_cache()  # the decode's room: the runtime's budget is near all of the device
    return total / t / 1e9


def pool_bytes(arg, kv_bytes, budget, cache):
    """--host-pool-gib in bytes, a multiple of 64 MiB: "auto" is the K/V beyond the
    budget's resident part, plus 2% and 1 GiB for partly filled pages."""
    if not budget or arg == "0":
        return 0
    chunk = 64 << 20
    resident = budget - (cache or budget // 8)
    want = (max(0, kv_bytes - resident) * 1.02 + (1 << 30)) if arg == "auto" else float(arg) * (1 << 30)
    return int(-(-want // chunk) * chunk)


def fill(cache, layers, n, nkv, d, chunk, device, dtype, mem, order="layers"):
    """n rows of random K/V per layer appended chunk by chunk, layer after layer
    (what one whole-prompt prefill leaves) or, with order "chunks", each chunk to
    every layer before the next (a chunked prefill); returns the seconds spent in
    the appends (K/V generation excluded), in all and per layer."""
    gen = torch.Generator(device=device).manual_seed(7)
    per_layer = [0.0] * layers
    starts = range(0, n, chunk)
    steps = ([(layer, s) for layer in range(layers) for s in starts] if order == "layers"
             else [(layer, s) for s in starts for layer in range(layers)])
    for i, (layer, s) in enumerate(steps):
        m = min(chunk, n - s)
        k = torch.randn(1, nkv, m, d, generator=gen, device=device, dtype=dtype)
        v = torch.randn(1, nkv, m, d, generator=gen, device=device, dtype=dtype)
        sync(device)
        t0 = time.perf_counter()
        cache.append_kv(layer, k, v)
        sync(device)
        per_layer[layer] += time.perf_counter() - t0
        del k, v
        # Peak memory once per layer (layers) or per chunk (chunks), outside the timed appends.
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if nxt is None or (nxt[0] != layer if order == "layers" else nxt[1] != s):
            mem.sample()
    # Layers filled once the budget is spent go to the host tier: their rate apart.
    print("fill (%s), seconds per layer: " % order + " ".join("%.2f" % t for t in per_layer), flush=True)
    return sum(per_layer), per_layer


EAGER = False  # --eager: generate's eager path (no CUDA graphs) instead of its compiled one


class TokenClock:
    """generate()'s streamer: the time each token reaches the host (the prompt first,
    then one put per step, each after generate's own wait for that step). Intervals
    between new tokens are what a streaming user sees; their median is the steady
    step, free of the call's set-up and wind-down."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass

    def steady_intervals(self, skip=2):
        """Milliseconds between new tokens, the first `skip` intervals left out
        (the first one holds the step that processes the prompt's last token)."""
        t = self.times[1:]  # new tokens only
        return [(b - a) * 1e3 for a, b in zip(t, t[1:])][skip:]


def timed_generate(model, ids, cache, steps, device, streamer=None):
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, past_key_values=cache, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             disable_compile=EAGER, streamer=streamer)
    sync(device)
    return time.perf_counter() - t0, out


def profile_steps(model, ids, cache, steps, device, top=25):
    """GPU time per generated step by kernel (torch.profiler, CUPTI: the kernels of
    CUDA graph replays included), over a generate of steps + 1 tokens; the first
    token's prefill of one row is part of the total, so steps should be >= 8."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t, out = timed_generate(model, ids, cache, steps + 1, device)
    kernels = kernel_times(prof)
    n_steps = steps + 1
    busy = sum(v[0] for v in kernels.values()) / 1e3 / n_steps
    print("profile: %d steps in %.1f ms (%.2f ms per step, profiled); GPU busy %.2f ms per step, by kernel (ms per step, "
          "launches per step):" % (n_steps, t * 1e3, t * 1e3 / n_steps, busy))
    top_kernels = [(name, us / 1e3 / n_steps, n / n_steps)
                   for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]]
    for name, ms, launches in top_kernels:
        print("  %8.3f  %6.1f  %s" % (ms, launches, name[:150]))
    return dict(wall_ms_per_step=t * 1e3 / n_steps, busy_ms_per_step=busy, kernels=top_kernels), out


def host_profile(model, ids, cache, steps, device, top=22):
    """The host's time per generated step by Python function (cProfile over a
    generate of steps + 1 tokens): where generate's loop spends the time between
    one step's wait and the next step's launch, while the device idles."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    t, out = timed_generate(model, ids, cache, steps + 1, device)
    prof.disable()
    st = pstats.Stats(prof)
    n = steps + 1
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # by own time
    print("host profile: %d steps in %.1f ms (%.2f ms per step); by function, own and cumulative ms per step:"
          % (n, t * 1e3, t * 1e3 / n))
    found = []
    for (file, line, fn), (cc, nc, tt, ct, _) in rows:
        where = "%s:%d %s" % (file.split("site-packages/")[-1][-60:], line, fn)
        print("  %8.3f %8.3f %7.1f  %s" % (tt * 1e3 / n, ct * 1e3 / n, nc / n, where))
        found.append((where, tt * 1e3 / n, ct * 1e3 / n, nc / n))
    ours = sorted(((k, v) for k, v in st.stats.items() if "/ssa/" in k[0]), key=lambda kv: -kv[1][3])[:8]
    print("  ssa's own, by cumulative ms per step:")
    for (file, line, fn), (cc, nc, tt, ct, _) in ours:
        print("  %8.3f %8.3f %7.1f  %s:%d %s" % (tt * 1e3 / n, ct * 1e3 / n, nc / n, file.split("/ssa/")[-1], line, fn))
    return dict(ms_per_step=t * 1e3 / n, functions=found), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--device-kv-budget-gib", type=float, default=96.0)
    ap.add_argument("--host-cache-gib", type=float, default=0.0, help="0: the library's default (1/8 of the budget)")
    ap.add_argument("--host-pool-gib", default="auto",
                    help="pinned host memory page-locked when the runtime is created (GiB, a multiple of 1/16); "
                         "'auto' (default): the K/V beyond the budget; 0: none (pinned during the fill)")
    ap.add_argument("--sparsity", type=float, default=50.0)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=65536)
    ap.add_argument("--fill-order", choices=["layers", "chunks"], default="layers",
                    help="layers: each layer's tokens, then the next layer's (a whole-prompt prefill); "
                         "chunks: each chunk to every layer (a chunked prefill)")
    ap.add_argument("--group-selection", default=None, choices=["mixture", "mean_query"],
                    help="rows chosen per KV head for its query heads (default: per query head)")
    ap.add_argument("--dense", action="store_true", help="also time dense decode from the tiers (a few steps)")
    ap.add_argument("--eager", action="store_true", help="generate without its compiled path (CUDA graphs)")
    ap.add_argument("--reserve-tokens", type=int, default=None, help="SSACache(reserve_tokens=); default by runtime")
    ap.add_argument("--proxy", default=None, help="SSACache(proxy=); default ssa.hf's (qpq; the fill shows it no queries)")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="also run STEPS steps under torch.profiler: GPU time per step by kernel")
    ap.add_argument("--host-profile", type=int, default=0, metavar="STEPS",
                    help="also run STEPS steps under cProfile: the host's time per step by Python function")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hidden, inter, nq, nkv, d = SHAPES[a.shape]
    elem = 2 if dtype == torch.bfloat16 else 4
    kv_bytes = a.layers * nkv * d * 2 * elem * a.tokens
    budget = int(a.device_kv_budget_gib * (1 << 30))
    cache_bytes = int(a.host_cache_gib * (1 << 30))
    pool = pool_bytes(a.host_pool_gib, kv_bytes, budget, cache_bytes) if device.type == "cuda" else 0
    t0 = time.perf_counter()
    rt = ssa.Runtime(backend="cuda" if device.type == "cuda" else "cpu", device=device.index or 0,
                     device_kv_budget=budget if device.type == "cuda" else 0,
                     host_cache_bytes=cache_bytes, host_pool_bytes=pool)
    lock_s = time.perf_counter() - t0
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print("# %s, %d layers, %d tokens (%.1f GiB of K/V), %s; %r; SSA %gx; torch %s, transformers %s, libssa %s"
          % (a.shape, a.layers, a.tokens, kv_bytes / 2 ** 30, where, rt, a.sparsity, torch.__version__,
             transformers.__version__, ssa.version()))
    if pool:
        print("host pool: %.1f GiB page-locked at the runtime's creation in %.1f s (%.2f GB/s), not in the fill"
              % (pool / 2 ** 30, lock_s, pool / lock_s / 1e9), flush=True)
    mem = DeviceMemory(device)
    model = make_model(a.shape, a.layers, device, dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if a.shape == "llama-3.1-8b" and device.type == "cuda":
        total = torch.cuda.mem_get_info()[1]
        print("dense decode would hold %.1f GiB of K/V + %.1f GiB of weights = %.1f GiB on a %.1f GiB device%s"
              % (kv_bytes / 2 ** 30, weights / 2 ** 30, (kv_bytes + weights) / 2 ** 30, total / 2 ** 30,
                 ": it does not fit" if kv_bytes + weights > total else ""))
    global EAGER
    EAGER = a.eager
    extra = dict(group_selection=a.group_selection) if a.group_selection else {}
    if a.reserve_tokens:
        extra["reserve_tokens"] = a.reserve_tokens
    if a.proxy:
        extra["proxy"] = a.proxy
    cache = ssa.hf.SSACache(model, runtime=rt, method="ssa", sparsity=a.sparsity, progress_min_tokens=None, **extra)
    n = a.tokens - 1
    t_fill, per_layer = fill(cache, a.layers, n, nkv, d, a.chunk, device, dtype, mem, a.fill_order)
    filled = kv_bytes * n // a.tokens
    fill_gbs = filled / t_fill / 1e9
    res = dict(tokens=a.tokens, layers=a.layers, shape=a.shape, budget_gib=a.device_kv_budget_gib,
               group_selection=a.group_selection, host_pool_gib=pool / 2 ** 30, host_pool_lock_s=lock_s,
               fill_s=t_fill, fill_gb_s=fill_gbs, fill_order=a.fill_order, eager=a.eager, reserve_tokens=a.reserve_tokens)
    line = "fill: %d tokens x %d layers in %.1f s of appends: %.2f GB/s" % (n, a.layers, t_fill, fill_gbs)
    # Layers whose K/V fit in the budget's resident part (the first ones) against
    # the rest, which go (mostly) to the host tier.
    layer_bytes = filled / a.layers
    parts = []
    if device.type == "cuda" and budget and a.fill_order == "layers":
        resident = budget - (cache_bytes or budget // 8)
        on_device = min(a.layers, int(resident // layer_bytes))
        parts = [("device-budget layers", per_layer[:on_device]), ("host-tier layers", per_layer[on_device:])]
    for name, times in parts:
        if times and sum(times) > 0:
            res[name.split()[0].replace("-", "_") + "_fill_gb_s"] = len(times) * layer_bytes / sum(times) / 1e9
            line += "; %s (%d): %.2f GB/s" % (name, len(times), len(times) * layer_bytes / sum(times) / 1e9)
    if device.type == "cuda":
        res["h2d_gb_s"] = h2d_rate(filled)
        line += ("\n  pinned host-to-device copy of the same %.1f GiB (1 GiB buffer): %.2f GB/s; the fill at %.0f%% "
                 "of it" % (filled / 2 ** 30, res["h2d_gb_s"], 100 * fill_gbs / res["h2d_gb_s"]))
        if "host_tier_fill_gb_s" in res:
            line += ", its host-tier layers at %.0f%%" % (100 * res["host_tier_fill_gb_s"] / res["h2d_gb_s"])
        line += " (target >= 50%)"
    print(line, flush=True)
    # The PQ index: trained at the first decode when nothing asks before; timed
    # here on its own (every layer's codebooks and all codes), the fill's second part.
    sync(device)
    t0 = time.perf_counter()
    cache.sessions[0].update_index()
    sync(device)
    res["index_s"] = time.perf_counter() - t0
    res["fill_with_index_gb_s"] = filled / (t_fill + res["index_s"]) / 1e9
    line = "index: %d layers trained and encoded in %.2f s; append + index: %.2f GB/s" % (
        a.layers, res["index_s"], res["fill_with_index_gb_s"])
    if "h2d_gb_s" in res:
        line += " = %.0f%% of the pinned copy (target >= 50%%)" % (100 * res["fill_with_index_gb_s"] / res["h2d_gb_s"])
    print(line, flush=True)
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, 32000, (1, a.tokens), device=device, generator=gen)
    _, ids = timed_generate(model, ids, cache, 2, device)  # warm-up
    per, steady = [], []
    for _ in range(a.reps):
        clock = TokenClock()
        t_many, out = timed_generate(model, ids, cache, a.steps + 1, device, clock)
        ids = out
        t_one, out = timed_generate(model, ids, cache, 1, device)
        ids = out
        per.append((t_many - t_one) / a.steps * 1e3)
        steady += clock.steady_intervals()
        mem.sample()
    per.sort()
    res["ms_per_token"] = per[len(per) // 2]
    res["steady_intervals_ms"] = list(steady)  # in the order the steps ran
    steady.sort()
    res["steady_ms_per_token"] = steady[len(steady) // 2] if steady else None
    # Rows read from the host per step: an observer sums every layer's stats.
    steps_rows, steps_hits = [], []

    def observer(layer_idx, q, out, stats, c):
        if layer_idx == c.shape.full_layers[0]:
            steps_rows.append(0)
            steps_hits.append(0)
        steps_rows[-1] += sum(s.rows_from_host for s in stats if s is not None)
        steps_hits[-1] += sum(s.host_cache_hits for s in stats if s is not None)
        mem.sample()

    cache.observer = observer
    _, ids = timed_generate(model, ids, cache, 4, device)
    cache.observer = None
    res["rows_from_host_per_step"] = steps_rows[1:] or steps_rows
    res["host_cache_hits_per_step"] = steps_hits[1:] or steps_hits
    res["peak_device_gib"] = mem.sample() / 2 ** 30
    if steady:
        print("steady step (median interval between streamed tokens, %d intervals, the first two of each generate "
              "left out): %.2f ms (%.1f tokens/s); intervals %.2f .. %.2f ms"
              % (len(steady), res["steady_ms_per_token"], 1e3 / res["steady_ms_per_token"], steady[0], steady[-1]))
    print("decode: %.2f ms per generated token (%.1f tokens/s), median of %d x %d steps at %d tokens; rows read "
          "from host per step (all layers, all heads): %s, read from the device cache of host pages: %s; peak device "
          "memory in use %.1f GiB"
          % (res["ms_per_token"], 1e3 / res["ms_per_token"], a.reps, a.steps, cache.get_seq_length(),
             res["rows_from_host_per_step"], res["host_cache_hits_per_step"], res["peak_device_gib"]), flush=True)
    if a.profile and device.type == "cuda":
        res["profile"], ids = profile_steps(model, ids, cache, a.profile, device)
    if a.host_profile:
        res["host_profile"], ids = host_profile(model, ids, cache, a.host_profile, device)
    if a.dense:
        cache.set_params(method="dense")
        t_many, ids = timed_generate(model, ids, cache, 3, device)
        t_one, ids = timed_generate(model, ids, cache, 1, device)
        res["dense_ms_per_token"] = (t_many - t_one) / 2 * 1e3
        print("dense decode from the tiers: %.1f ms per generated token" % res["dense_ms_per_token"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
