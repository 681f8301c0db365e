"""Sessions across processes over a torch.distributed process group (docs/DISTRIBUTED.md).

Every process of the group makes a runtime from the group; each session of it is
sharded by position over the ranks (rank i holds shard i of ``shard_tokens`` tokens,
the last rank the rest: only those K/V rows and codes live in its memory), and every
decode is a collective call: all ranks pass the same q and get the same output, bitwise
the unsharded session's. Example (on each rank)::

    import torch.distributed as dist, ssa, ssa.distributed
    dist.init_process_group("gloo", ...)
    rt = ssa.distributed.runtime(threads=1, shard_tokens=1 << 20)
    s = rt.create_session(...)      # every rank: the same calls, in the same order
    s.append(0, k, v)               # every rank passes the same rows, keeps its shard's
    out = s.decode(0, q)            # collective: the same q on every rank
    s.save(path)                    # collective: a file per rank beside path + a manifest
    s2 = rt.load(path)              # collective; a set of any group size, or one file

Index training (at an append that reaches the index policy's threshold, update_index,
or a decode on an untrained layer), save and load are collective calls too.

The collectives go through the group's own transport (gloo on CPUs); libssa calls them
on the thread that called it, and each waits at most ``timeout_ms``: a rank that died or
left gives the others ``ssa.IOError``, not a hang.
"""
import datetime
import time
from typing import Any, Optional

from ._core import Runtime
from ._ssa_cffi import ffi, lib

__all__ = ["TorchCollective", "runtime"]


class TorchCollective:
    """The ``ssa_collective`` table of one rank of a torch.distributed process group.

    Args:
        group: the process group (None: the default group).
        timeout_ms: how long each collective may wait for the other ranks.

    Attributes:
        table: the filled ``ssa_collective *`` (pass as ``Runtime(collective=...)``).
        last_error: the exception of the last failed collective, or None.
        seconds, calls: time spent in the collectives (waiting for peers included) and
            their count, for measuring their share of a decode.
    """

    def __init__(self, group: Any = None, timeout_ms: int = 60000):
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized (call init_process_group first)")
        if not 0 < int(timeout_ms) < (1 << 32):
            raise ValueError("timeout_ms must be in 1..2**32-1")
        self._torch, self._dist, self._group = torch, dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.last_error: Optional[BaseException] = None
        self.seconds = 0.0
        self.calls = 0
        table = ffi.new("ssa_collective *")
        lib.ssa_collective_init(table)
        table.rank = self.rank
        table.size = self.size
        table.timeout_ms = int(timeout_ms)

        def failed(exc_type, exc, tb):
            self.last_error = exc
            return 1

        # Kept on self: the C side holds only the pointers.
        self._callbacks = (
            ffi.callback("int(void *, uint64_t *, size_t, uint32_t)",
                         lambda *a: self._timed(self._sum, *a), onerror=failed),
            ffi.callback("int(void *, float *, size_t, uint32_t)",
                         lambda *a: self._timed(self._max, *a), onerror=failed),
            ffi.callback("int(void *, const void *, size_t, void *, uint32_t)",
                         lambda *a: self._timed(self._gather, *a), onerror=failed),
        )
        table.all_reduce_sum_u64, table.all_reduce_max_f32, table.all_gather = self._callbacks
        self.table = table

    def _wait(self, work, timeout_ms: int) -> int:
        if work.wait(timeout=datetime.timedelta(milliseconds=timeout_ms)) is False:
            raise TimeoutError("collective did not complete within %d ms" % timeout_ms)
        return 0

    def _timed(self, op, *args) -> int:
        t0 = time.perf_counter()
        try:
            return op(*args)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1

    def _reduce(self, data, nbytes: int, dtype, op, timeout_ms: int) -> int:
        if nbytes == 0:
            return 0
        t = self._torch.frombuffer(ffi.buffer(data, nbytes), dtype=dtype)
        return self._wait(self._dist.all_reduce(t, op=op, group=self._group, async_op=True), timeout_ms)

    def _sum(self, user, data, n, timeout_ms):
        # int64 addition wraps exactly as uint64 addition: the same bits.
        return self._reduce(data, 8 * n, self._torch.int64, self._dist.ReduceOp.SUM, timeout_ms)

    def _max(self, user, data, n, timeout_ms):
        return self._reduce(data, 4 * n, self._torch.float32, self._dist.ReduceOp.MAX, timeout_ms)

    def _gather(self, user, send, nbytes, recv, timeout_ms):
        if nbytes == 0:
            return 0
        torch = self._torch
        mine = torch.frombuffer(bytearray(ffi.buffer(send, nbytes)), dtype=torch.uint8)
        out = torch.frombuffer(ffi.buffer(recv, nbytes * self.size), dtype=torch.uint8)
        parts = list(out.split(nbytes))
        return self._wait(self._dist.all_gather(parts, mine, group=self._group, async_op=True), timeout_ms)


def runtime(group: Any = None, timeout_ms: int = 60000, **options: Any) -> Runtime:
    """A CPU runtime that is this process's rank of ``group`` (None: the default group).

    Collective: every rank of the group calls it (it checks that they agree on
    ``shard_tokens`` and their numbering). ``options`` go to ``ssa.Runtime`` (threads,
    seed, shard_tokens); the backend is the CPU.
    """
    options.setdefault("backend", "cpu")
    return Runtime(collective=TorchCollective(group, timeout_ms), **options)
