"""PyTorch SDPA dense decode, the reference of bench/gpu_decode_bench.cu: the same
shapes (paper: 16 q heads, 4 KV heads, head dim 256, f16; llama8b: 32 q, 8 KV,
head dim 128, bf16), contexts 128K, 512K and 1M, batch 1 and 16 (16 distinct
sequences), one query token, enable_gqa; backends flash and cuDNN.

Timing as in the C++ program: CUDA events, the L2 flushed (256 MiB read) before
every timed call, 2 warm-up calls, 3 to estimate, then enough calls for about
100 ms (10..100); the median per input set (query seed) and the median over the
input sets. Also the device-to-device copy bandwidth (a second opinion; the
report uses the C++ program's). Prints one JSON object per line (and writes them
to --out FILE); lines starting with '#' are progress notes.
"""
import argparse
import json
import math
import sys
import time

SHAPES = (("paper", 16, 4, 256, "f16"), ("llama8b", 32, 8, 128, "bf16"))
TARGET_MS, WARM, ESTIMATE, MIN_REPS, MAX_REPS = 100.0, 2, 3, 10, 100

out_file = None


def emit(rec):
    line = json.dumps(rec)
    print(line, flush=True)
    if out_file:
        out_file.write(line + "\n")
        out_file.flush()


def note(msg):
    print("# " + msg, flush=True)
    if out_file:
        out_file.write("# " + msg + "\n")
        out_file.flush()


def median(v):
    v = sorted(v)
    n = len(v)
    if n == 0:
        return float("nan")
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def parse_list(s):
    out = []
    for part in s.split(","):
        mult = 1
        if part[-1:] in ("K", "k"):
            mult, part = 1024, part[:-1]
        elif part[-1:] in ("M", "m"):
            mult, part = 1 << 20, part[:-1]
        out.append(int(part) * mult)
    return out


def main():
    global out_file
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--configs", default="paper,llama8b")
    ap.add_argument("--contexts", default="128K,512K,1M")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--backends", default="flash,cudnn")
    ap.add_argument("--time-budget-s", type=float, default=150.0)
    args = ap.parse_args()
    if args.out:
        out_file = open(args.out, "w")
    start = time.monotonic()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # no PyTorch: say so, the rest of the run goes on
        emit({"rec": "fatal", "src": "sdpa", "error": f"import torch: {type(e).__name__}: {e}"})
        return 3
    if not torch.cuda.is_available():
        emit({"rec": "fatal", "src": "sdpa", "error": "torch.cuda.is_available() is False"})
        return 3
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    cudnn_version = None
    try:
        cudnn_version = torch.backends.cudnn.version()
    except Exception:
        pass
    emit({"rec": "meta", "src": "sdpa", "torch": torch.__version__, "cuda": torch.version.cuda,
          "cudnn": cudnn_version, "device": torch.cuda.get_device_name(0), "seeds": args.seeds,
          "target_ms": TARGET_MS, "flush_mb": 256})

    flush = torch.ones(64 << 20, dtype=torch.int32, device="cuda")  # 256 MiB
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once(fn):
        flush.sum()  # reads 256 MiB: the next call finds none of its data in L2
        ev0.record()
        fn()
        ev1.record()
        ev1.synchronize()
        return ev0.elapsed_time(ev1)

    def measure(fn):
        for _ in range(WARM):
            once(fn)
        t = max(median([once(fn) for _ in range(ESTIMATE)]), 1e-3)
        reps = 3 if t > 50.0 else min(MAX_REPS, max(MIN_REPS, math.ceil(TARGET_MS / t)))
        return median([once(fn) for _ in range(reps)]), reps

    def context_ok():
        try:
            torch.cuda.synchronize()
            return True
        except Exception:
            return False

    # Copy bandwidth: (read + write) bytes / time of a 4 GiB device-to-device copy.
    try:
        a = torch.ones(1 << 30, dtype=torch.int32, device="cuda")
        b = torch.empty_like(a)
        for _ in range(2):
            b.copy_(a)
        times = []
        for _ in range(10):
            ev0.record()
            b.copy_(a)
            ev1.record()
            ev1.synchronize()
            times.append(ev0.elapsed_time(ev1))
        ms = median(times)
        nbytes = a.numel() * 4
        emit({"rec": "copy_bw", "src": "sdpa", "bytes": nbytes, "ms": ms, "gbps": 2 * nbytes / (ms * 1e6),
              "what": "torch copy_ device to device, (read + write) bytes / time"})
        del a, b
    except Exception as e:
        emit({"rec": "error", "src": "sdpa", "method": "copy_bw", "error": f"{type(e).__name__}: {str(e)[:200]}"})
    torch.cuda.empty_cache()

    names = args.configs.split(",")
    for name, nq, nkv, d, dt_name in SHAPES:
        if name not in names:
            continue
        dt = dtypes[dt_name]
        for n in parse_list(args.contexts):
            for batch in parse_list(args.batches):
                base = {"src": "sdpa", "config": name, "dtype": dt_name, "nq": nq, "nkv": nkv, "d": d, "n": n,
                        "batch": batch}

                def error(method, msg):
                    emit(dict(base, rec="error", method=method, sparsity=0, error=msg))
                    note(f"ERROR {name} n={n} batch={batch} {method}: {msg}")

                if time.monotonic() - start > args.time_budget_s:
                    error("*", f"skipped: time budget of {args.time_budget_s:.0f} s spent")
                    continue
                k = v = None
                qs = []
                try:
                    # [batch, heads, tokens, head dim]; every batch row its own sequence.
                    g = torch.Generator(device="cuda")
                    g.manual_seed(1000 * n + batch)
                    k = torch.empty((batch, nkv, n, d), dtype=dt, device="cuda").normal_(generator=g)
                    v = torch.empty((batch, nkv, n, d), dtype=dt, device="cuda").normal_(generator=g)
                    for seed in range(args.seeds):
                        gq = torch.Generator(device="cuda")
                        gq.manual_seed(seed + 1)
                        qs.append(torch.randn((batch, nq, 1, d), generator=gq, dtype=dt, device="cuda"))
                    torch.cuda.synchronize()
                except Exception as e:
                    msg = f"allocation: {type(e).__name__}: {str(e)[:200]}"
                    del k, v, qs
                    if not context_ok():
                        emit({"rec": "fatal", "src": "sdpa", "error": msg})
                        return 3
                    torch.cuda.empty_cache()
                    error("*", msg)
                    continue
                nbytes = batch * n * nkv * d * 2 * 2  # K and V once
                for bname in args.backends.split(","):
                    method = "sdpa_" + bname
                    try:
                        per_seed, reps = [], []
                        with sdpa_kernel(backends[bname]):
                            for q in qs:
                                ms, r = measure(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                                per_seed.append(ms)
                                reps.append(r)
                        ms = median(per_seed)
                        emit(dict(base, rec="result", method=method, sparsity=0, k=n, ms=ms, ms_seeds=per_seed,
                                  reps=reps, bytes=nbytes, gbps=nbytes / (ms * 1e6), torch=torch.__version__))
                        note(f"{name} n={n} batch={batch} {method}: {ms:.3f} ms ({nbytes / (ms * 1e6):.0f} GB/s)")
                    except Exception as e:  # backend not available for this shape, or out of memory
                        msg = f"{type(e).__name__}: {str(e)[:200]}"
                        if not context_ok():
                            emit({"rec": "fatal", "src": "sdpa", "error": f"{name} n={n} batch={batch} {method}: {msg}"})
                            return 3
                        error(method, msg)
                del k, v, qs
                torch.cuda.empty_cache()
    note(f"done in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
