"""The OS page cache and a disk's read rate, without root.

A restore read from the page cache measures memory copies, not the disk. Dropping
the whole cache (/proc/sys/vm/drop_caches) needs root; evicting the pages of given
files does not: posix_fadvise(POSIX_FADV_DONTNEED) drops a file's clean cached
pages (fsync first, so that none is dirty). mincore() on a mapping of the file says
how much of it is still cached, so the eviction is checked, not assumed.

  python examples/python/page_cache.py --check [--dir DIR] [--gib 2]
      writes a file, reads it warm, evicts it and reads it cold; prints the cached
      fraction after each step and both read rates.

From Python: evict(paths), cached_fraction(paths), read_rate(paths).
"""
import argparse
import ctypes
import ctypes.util
import mmap
import os
import tempfile
import time

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def files_under(paths):
    """The regular files of paths (files, or folders walked recursively), sorted."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                out += [os.path.join(root, n) for n in names]
        else:
            out.append(p)
    return sorted(f for f in out if os.path.isfile(f))


def evict(paths):
    """Drops the cached pages of the files (fsync first: only clean pages can go)."""
    for f in files_under(paths):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_bytes(path):
    """(bytes of the file in the page cache, file size), by mincore() on a mapping."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap of " + path)
        try:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore of " + path)
            resident = sum(b & 1 for b in vec)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(size, resident * page), size


def cached_fraction(paths):
    """Fraction of the files' bytes in the page cache (0..1; 0 for no bytes)."""
    got = total = 0
    for f in files_under(paths):
        c, s = cached_bytes(f)
        got += c
        total += s
    return got / total if total else 0.0


def read_rate(paths, block=64 << 20):
    """(bytes, seconds) of reading the files one after another with `block`-byte reads."""
    buf = bytearray(block)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    for f in files_under(paths):
        with open(f, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
    return total, time.perf_counter() - t0


def check(folder, gib):
    path = os.path.join(folder, "page_cache_check.bin")
    chunk = os.urandom(16 << 20)
    with open(path, "wb") as f:
        for _ in range(int(gib * 64)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    try:
        print("written: %.2f GiB, cached %.0f%%" % (os.path.getsize(path) / 2 ** 30, 100 * cached_fraction([path])))
        n, warm = read_rate([path])
        print("warm read: %.2f GB/s, cached %.0f%%" % (n / warm / 1e9, 100 * cached_fraction([path])))
        evict([path])
        print("evicted (fsync + POSIX_FADV_DONTNEED): cached %.0f%%" % (100 * cached_fraction([path])))
        n, cold = read_rate([path])
        print("cold read: %.2f GB/s (%.1fx the warm read's time), cached %.0f%% after it"
              % (n / cold / 1e9, cold / warm, 100 * cached_fraction([path])))
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="check eviction on a file of --gib GiB in --dir")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--gib", type=float, default=2.0)
    a = ap.parse_args()
    if a.check:
        check(a.dir, a.gib)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
