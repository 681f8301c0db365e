"""PyTorch SDPA dense decode in the benchmark's configuration (16 q heads, 4 KV
heads, head dim 256, f16, batch 1), timed with CUDA events (median), for the
table of bench/RESULTS_gpu_decode.md. Prints markdown rows."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def median_ms(fn, warm=5, reps=30):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


for n in (131072, 1048576):
    q = torch.randn(1, 16, 1, 256, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 4, n, 256, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 4, n, 256, device="cuda", dtype=torch.float16)
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                ms = median_ms(fn)
            gb = n * 4 * 256 * 2 * 2 / 1e9
            print(f"| {n // 1024}K | PyTorch SDPA ({name}, enable_gqa) | N | {ms:.3f} | | {gb * 1e3:.1f} MB | {gb / (ms * 1e-3):.0f} |")
        except Exception as e:  # backend not available for this shape
            print(f"| {n // 1024}K | PyTorch SDPA ({name}) | N | n/a: {type(e).__name__}: {str(e)[:80]} | | | |")
    del q, k, v
    torch.cuda.empty_cache()
