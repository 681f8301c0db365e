"""Page-locking host memory on this machine, three ways: what a host pool
(ssa_runtime_options.host_pool_bytes) costs at runtime creation, and whether another
way of pinning would make it cheaper.

  cudaHostAlloc     torch.empty(64 MiB, pin_memory=True) chunk after chunk (libssa pins
                    its pool's chunks with cudaHostAlloc, portable and mapped)
  register          anonymous memory touched first (page faults and zeroing), then
                    cudaHostRegister(portable | mapped) per 64 MiB chunk: both times apart
  register, THP     the same with transparent huge pages asked for (madvise) before the touch

  python3 bench/pin_rate_bench.py [--gib 8]
"""
import argparse
import ctypes
import mmap
import time

import torch

CHUNK = 64 << 20
PORTABLE_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped


def host_alloc(total):
    t0 = time.perf_counter()
    keep = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(total // CHUNK)]
    t = time.perf_counter() - t0
    del keep
    return t, None


def register(total, huge):
    cudart = torch.cuda.cudart()
    mm = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        mm.madvise(mmap.MADV_HUGEPAGE)
    buf = ctypes.c_char.from_buffer(mm)
    addr = ctypes.addressof(buf)
    t0 = time.perf_counter()
    ctypes.memset(addr, 0, total)
    touched = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = []
    for off in range(0, total, CHUNK):
        err = cudart.cudaHostRegister(addr + off, CHUNK, PORTABLE_MAPPED)
        if int(err) != 0:
            raise RuntimeError("cudaHostRegister: error %s" % err)
        done.append(addr + off)
    registered = time.perf_counter() - t0
    for p in done:
        cudart.cudaHostUnregister(p)
    del buf
    mm.close()
    return registered, touched


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=8.0)
    a = ap.parse_args()
    total = int(a.gib * (1 << 30)) // CHUNK * CHUNK
    torch.cuda.init()
    print("# %.1f GiB in 64 MiB chunks, %s" % (total / 2 ** 30, torch.cuda.get_device_name()))
    for name, fn in (("cudaHostAlloc", lambda: host_alloc(total)),
                     ("register", lambda: register(total, False)),
                     ("register, THP", lambda: register(total, True))):
        pinned, touched = fn()
        if touched is None:
            print("%-14s %.2f s, %.2f GB/s" % (name, pinned, total / pinned / 1e9))
        else:
            print("%-14s touch %.2f s + register %.2f s = %.2f GB/s (register alone %.2f GB/s)"
                  % (name, touched, pinned, total / (touched + pinned) / 1e9, total / pinned / 1e9))


if __name__ == "__main__":
    main()
