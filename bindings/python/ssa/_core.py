"""Runtime and Session: the Python face of libssa's handles."""
import enum
import os
import threading
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from . import _arrays
from ._errors import check, invalid
from ._ssa_cffi import ffi, lib

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class Status(enum.IntEnum):
    """ssa_status values."""

    OK = lib.SSA_OK
    INVALID_ARGUMENT = lib.SSA_ERR_INVALID_ARGUMENT
    OUT_OF_MEMORY = lib.SSA_ERR_OUT_OF_MEMORY
    IO = lib.SSA_ERR_IO
    CORRUPT = lib.SSA_ERR_CORRUPT
    VERSION = lib.SSA_ERR_VERSION
    MISMATCH = lib.SSA_ERR_MISMATCH
    UNSUPPORTED = lib.SSA_ERR_UNSUPPORTED
    DEVICE = lib.SSA_ERR_DEVICE
    BUSY = lib.SSA_ERR_BUSY
    INTERNAL = lib.SSA_ERR_INTERNAL


class Backend(enum.IntEnum):
    """ssa_backend values."""

    AUTO = lib.SSA_BACKEND_AUTO
    CPU = lib.SSA_BACKEND_CPU
    CUDA = lib.SSA_BACKEND_CUDA


class DType(enum.IntEnum):
    """ssa_dtype values: the element type of K, V, q and out of a session."""

    FLOAT32 = lib.SSA_DTYPE_F32
    FLOAT16 = lib.SSA_DTYPE_F16
    BFLOAT16 = lib.SSA_DTYPE_BF16


class Proxy(enum.IntEnum):
    """ssa_proxy values: the score a session ranks and samples candidates by (see ssa.h)."""

    PQ = lib.SSA_PROXY_PQ
    OPQ = lib.SSA_PROXY_OPQ
    PQ4 = lib.SSA_PROXY_PQ4
    OPQ4 = lib.SSA_PROXY_OPQ4
    QPQ = lib.SSA_PROXY_QPQ
    QPQ4 = lib.SSA_PROXY_QPQ4


class Method(enum.IntEnum):
    """ssa_method values: how a decode spends its budget (see ssa.h)."""

    DENSE = lib.SSA_METHOD_DENSE
    ORACLE_TOPK = lib.SSA_METHOD_ORACLE_TOPK
    PQ_TOPK = lib.SSA_METHOD_PQ_TOPK
    HYBRID_UNIFORM = lib.SSA_METHOD_HYBRID_UNIFORM
    SAMPLING = lib.SSA_METHOD_SAMPLING
    SSA = lib.SSA_METHOD_SSA
    SSA_ADAPTIVE = lib.SSA_METHOD_SSA_ADAPTIVE


METHODS = tuple(m.name.lower() for m in Method)


class GroupSelection(enum.IntEnum):
    """ssa_group_selection values: who selects the middle rows in a GQA model
    (docs/GROUP_SELECTION.md). OFF: every query head alone; MIXTURE / MEAN_QUERY:
    one selection per KV head, shared by its query heads."""

    OFF = lib.SSA_GROUP_OFF
    MIXTURE = lib.SSA_GROUP_MIXTURE
    MEAN_QUERY = lib.SSA_GROUP_MEAN_QUERY

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def version() -> Tuple[int, int, int]:
    """(major, minor, patch) of the libssa actually loaded."""
    v = int(lib.ssa_version())
    return v // 10000, (v // 100) % 100, v % 100


def header_version() -> Tuple[int, int, int]:
    """(major, minor, patch) of the ssa.h this binding was built against."""
    return int(lib.SSA_VERSION_MAJOR), int(lib.SSA_VERSION_MINOR), int(lib.SSA_VERSION_PATCH)


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
        raise invalid("%s must be an integer, got %r" % (name, value))
    v = int(value.__index__()) if not isinstance(value, int) else value
    if v < lo or v > hi:
        raise invalid("%s=%d is out of range [%d, %d]" % (name, v, lo, hi))
    return v


def _float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise invalid("%s must be a number, got %r" % (name, value)) from None


def _enum(name: str, value: Any, cls, aliases=None) -> int:
    if isinstance(value, cls):
        return int(value)
    if isinstance(value, str):
        key = value.strip().lower()
        if aliases and key in aliases:
            return int(aliases[key])
        for m in cls:
            if m.name.lower() == key:
                return int(m)
        choices = sorted(set([m.name.lower() for m in cls] + list(aliases or {})))
        raise invalid("unknown %s %r; expected one of %s" % (name, value, ", ".join(choices)))
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)  # raw value: the library validates it
    raise invalid("%s must be a string or ssa.%s, got %r" % (name, cls.__name__, value))


_DTYPE_ALIASES = {"f32": DType.FLOAT32, "fp32": DType.FLOAT32, "f16": DType.FLOAT16,
                  "fp16": DType.FLOAT16, "half": DType.FLOAT16, "bf16": DType.BFLOAT16}


def _dtype(value: Any) -> int:
    if not isinstance(value, (str, DType, int)):
        # numpy / ml_dtypes dtype objects and scalar types
        try:
            import numpy as np

            name = np.dtype(value).name
        except TypeError:
            raise invalid("dtype must be 'float16', 'bfloat16' or 'float32', got %r" % (value,)) from None
        value = name
    return _enum("dtype", value, DType, _DTYPE_ALIASES)


def _path(path: PathLike) -> bytes:
    try:
        p = os.fsencode(path)
    except TypeError:
        raise invalid("path must be str, bytes or os.PathLike, got %r" % (path,)) from None
    if b"\0" in p:
        raise invalid("path contains a NUL byte")
    return p


@dataclass(frozen=True)
class SessionConfig:
    """A session's configuration as the library resolved it (ssa_session_config)."""

    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    dtype: DType
    pq_subspaces: int
    pq_centroids: int
    model_fingerprint: int
    page_tokens: int
    flags: int
    index_min_tokens: int
    index_regrow_factor: float
    index_train_sample: int
    index_iterations: int
    proxy: "Proxy" = None  # type: ignore[assignment]
    pq_parallel_weight: float = 1.0

    @classmethod
    def _from_c(cls, c) -> "SessionConfig":
        return cls(c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim, DType(c.kv_dtype), c.pq_subspaces,
                   c.pq_centroids, c.model_fingerprint, c.page_tokens, c.flags, c.index_min_tokens,
                   float(c.index_regrow_factor), c.index_train_sample, c.index_iterations, Proxy(c.proxy),
                   float(c.pq_parallel_weight))


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot file holds, read without loading it (ssa_snapshot_info)."""

    format_version: int
    generation: int
    file_bytes: int
    live_bytes: int
    n_sections: int
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    dtype: DType
    pq_subspaces: int
    pq_centroids: int
    page_tokens: int
    indexed_layers: int
    model_fingerprint: int
    length: int
    max_layer_length: int
    metadata_bytes: int
    proxy: Proxy
    pq_parallel_weight: float


def inspect(path: PathLike) -> SnapshotInfo:
    """Describes the snapshot at path (a session's file or a group's manifest)
    without loading it: its shape, proxy, length and generation. The config, layer and
    metadata sections are read and their checksums verified; K/V pages, codes and
    codebooks are not read. Raises ssa.IOError, ssa.Corrupt, ssa.Version."""
    info = ffi.new("ssa_snapshot_info *")
    lib.ssa_snapshot_info_init(info)
    check(lib.ssa_snapshot_inspect(_path(path), info), "ssa_snapshot_inspect")
    i = info[0]
    return SnapshotInfo(i.format_version, i.generation, i.file_bytes, i.live_bytes, i.n_sections, i.n_layers,
                        i.n_q_heads, i.n_kv_heads, i.head_dim, DType(i.kv_dtype), i.pq_subspaces, i.pq_centroids,
                        i.page_tokens, i.indexed_layers, i.model_fingerprint, i.length, i.max_layer_length,
                        i.metadata_bytes, Proxy(i.proxy), i.pq_parallel_weight)


@dataclass(frozen=True)
class DecodeStats:
    """What a decode did (ssa_decode_stats); sums are over query heads."""

    context_tokens: int
    tokens_read: int
    heavy_tokens: int
    draws: int
    unique_samples: int
    residual_proxy_mass: float
    scored_tokens: int
    # error-targeted decodes (target_error); 0 otherwise
    target_budget: int = 0       # budget each head chose, summed over heads
    capped_heads: int = 0        # heads stopped by max_budget above their target
    predicted_error: float = 0.0  # predicted relative error at 1 - target_delta, summed
    # heads whose budget did not exceed sink + local on a longer context (they read
    # only those tokens, nothing sparse); nonzero means: raise the budget
    window_only_heads: int = 0
    # tiered CUDA sessions (Runtime(device_kv_budget=...)): rows read over the bus
    # from host pages, and rows of host pages read from their device copy
    rows_from_host: int = 0
    host_cache_hits: int = 0

    @classmethod
    def _from_c(cls, s) -> "DecodeStats":
        return cls(s.context_tokens, s.tokens_read, s.heavy_tokens, s.draws, s.unique_samples,
                   float(s.residual_proxy_mass), s.scored_tokens, s.target_budget, s.capped_heads,
                   float(s.predicted_error), s.window_only_heads, s.rows_from_host, s.host_cache_hits)


@dataclass(frozen=True)
class DecodeTrace:
    """The rows each query head read in one decode (ssa_decode_traced).

    tokens: uint32, every head's distinct token indices in ascending order, heads
    one after another; head h's are tokens[offsets[h]:offsets[h + 1]].
    offsets: uint64 [n_q_heads + 1]. log_pi: float32 like tokens (log inclusion
    probability; 0 for sink, local and heavy rows), or None when not asked for."""

    tokens: Any
    offsets: Any
    log_pi: Any = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def head(self, h: int):
        """Head h's rows (a view of tokens)."""
        if not 0 <= h < len(self):
            raise invalid("head %r is out of range [0, %d)" % (h, len(self)))
        return self.tokens[int(self.offsets[h]):int(self.offsets[h + 1])]


def _stream_ptr(stream: Any):
    if stream is None:
        return ffi.NULL
    handle = getattr(stream, "cuda_stream", stream)  # torch.cuda.Stream has .cuda_stream
    return ffi.cast("void *", _int("stream", handle, 0, _U64))


def _decode_params(method: Any = "ssa", sparsity: float = 50.0, budget: Optional[int] = None,
                   heavy_fraction: float = 0.4, n_sink: int = 128, n_local: int = 128,
                   seed: Optional[int] = None, step: int = 0, pi_min: Optional[float] = None,
                   stream: Any = None, target_error: Optional[float] = None,
                   target_delta: Optional[float] = None, max_budget: Optional[int] = None,
                   group_selection: Any = "off"):
    p = ffi.new("ssa_decode_params *")
    lib.ssa_decode_params_init(p)
    p.method = _enum("method", method, Method)
    p.budget = 0 if budget is None else _int("budget", budget, 1, _U32)
    p.sparsity = _float("sparsity", sparsity)
    p.heavy_fraction = _float("heavy_fraction", heavy_fraction)
    p.n_sink = _int("n_sink", n_sink, 0, _U32)
    p.n_local = _int("n_local", n_local, 0, _U32)
    if pi_min is not None:
        p.pi_min = _float("pi_min", pi_min)
    p.seed = 0 if seed is None else _int("seed", seed, 0, _U64)
    p.step = _int("step", step, 0, _U64)
    p.stream = _stream_ptr(stream)
    # The library checks the values (and says which is wrong); None keeps its default.
    if target_error is not None:
        p.target_error = _float("target_error", target_error)
    if target_delta is not None:
        p.target_delta = _float("target_delta", target_delta)
    if max_budget is not None:
        p.max_budget = _int("max_budget", max_budget, 0, _U32)
    p.group_selection = _enum("group_selection", group_selection, GroupSelection)
    return p


def _session_config(n_layers: int, n_q_heads: int, n_kv_heads: int, head_dim: int, dtype: Any = "float16", *,
                    pq_subspaces: Optional[int] = None, pq_centroids: Optional[int] = None,
                    model_fingerprint: int = 0, page_tokens: Optional[int] = None, host_pointers: bool = False,
                    index_min_tokens: Optional[int] = None, index_regrow_factor: Optional[float] = None,
                    index_train_sample: Optional[int] = None, index_iterations: Optional[int] = None,
                    proxy: Any = None, pq_parallel_weight: Optional[float] = None):
    """A checked ssa_session_config from create_session's arguments."""
    cfg = ffi.new("ssa_session_config *")
    lib.ssa_session_config_init(cfg)
    cfg.n_layers = _int("n_layers", n_layers, 0, _U32)
    cfg.n_q_heads = _int("n_q_heads", n_q_heads, 0, _U32)
    cfg.n_kv_heads = _int("n_kv_heads", n_kv_heads, 0, _U32)
    cfg.head_dim = _int("head_dim", head_dim, 0, _U32)
    cfg.kv_dtype = _dtype(dtype)
    if pq_subspaces is not None:
        cfg.pq_subspaces = _int("pq_subspaces", pq_subspaces, 0, _U32)
    if pq_centroids is not None:
        cfg.pq_centroids = _int("pq_centroids", pq_centroids, 0, _U32)
    cfg.model_fingerprint = _int("model_fingerprint", model_fingerprint, 0, _U64)
    if page_tokens is not None:
        cfg.page_tokens = _int("page_tokens", page_tokens, 0, _U32)
    if host_pointers:
        cfg.flags |= lib.SSA_SESSION_HOST_POINTERS
    if index_min_tokens is not None:
        cfg.index_min_tokens = _int("index_min_tokens", index_min_tokens, 0, _U32)
    if index_regrow_factor is not None:
        cfg.index_regrow_factor = _float("index_regrow_factor", index_regrow_factor)
    if index_train_sample is not None:
        cfg.index_train_sample = _int("index_train_sample", index_train_sample, 0, _U32)
    if index_iterations is not None:
        cfg.index_iterations = _int("index_iterations", index_iterations, 0, _U32)
    if proxy is not None:
        names = {"pq": Proxy.PQ, "opq": Proxy.OPQ, "pq4": Proxy.PQ4, "opq4": Proxy.OPQ4, "qpq": Proxy.QPQ,
                 "qpq4": Proxy.QPQ4}
        if isinstance(proxy, str) and proxy.lower() in names:
            cfg.proxy = names[proxy.lower()]
        elif isinstance(proxy, Proxy):
            cfg.proxy = int(proxy)
        else:
            raise invalid("proxy must be 'pq', 'opq', 'pq4', 'opq4', 'qpq' or 'qpq4' (or an ssa.Proxy), got %r"
                          % (proxy,))
    if pq_parallel_weight is not None:
        cfg.pq_parallel_weight = _float("pq_parallel_weight", pq_parallel_weight)
    return cfg


class Runtime:
    """A libssa runtime: backend choice, CPU worker threads and the default sampling seed.

    Args:
        backend: "auto" (CUDA if built and a device exists, else CPU), "cpu" or "cuda".
        threads: CPU worker threads; 0 means the hardware concurrency.
        seed: default seed for sampling decodes that pass no seed (None: library default).
        device: CUDA device ordinal.
        device_kv_budget: bytes of device memory the K/V pages of this runtime's CUDA
            sessions may use (0: no limit); pages beyond it live in pinned host memory.
        host_cache_bytes: the part of the budget for device copies of host pages read
            recently (0: an eighth of the budget).
        host_pool_bytes: pinned host memory page-locked now, when the runtime is
            created, for the host tier of its CUDA sessions (0: none, host pages are
            pinned as sessions need them); a multiple of 64 MiB, only with a
            device_kv_budget. Page-locking runs at about 2 GB/s: pinned during a
            fill it would bound the fill. Chunks freed by sessions stay with the
            runtime. CPU runtimes check it and ignore it.
        devices: sharded sessions (docs/SHARDING.md): one shard per entry, in shard order
            (distinct ordinals >= 0; on the CPU backend they only name in-process shards).
            None: one device, ``device``.
        shard_tokens: tokens a shard takes before the next one starts; 0 = the library's
            default (1048576); else a multiple of 8192.
        collective: this process is one rank of a group of processes (docs/DISTRIBUTED.md):
            an object whose ``table`` is a filled ``ssa_collective *`` (for a torch.distributed
            process group: ``ssa.distributed.TorchCollective``, or ``ssa.distributed.runtime``).
            The runtime keeps it alive.

    A runtime may be used from any number of threads. It is freed by close() (or by
    leaving a ``with`` block) once every session made from it is closed; sessions
    keep their runtime alive, so closing the runtime first is safe.
    """

    def __init__(self, backend: Union[str, Backend] = "auto", threads: int = 0, seed: Optional[int] = None,
                 device: int = 0, device_kv_budget: int = 0, host_cache_bytes: int = 0,
                 devices: Optional[Sequence[int]] = None, shard_tokens: int = 0, collective: Any = None,
                 host_pool_bytes: int = 0):
        opts = ffi.new("ssa_runtime_options *")
        lib.ssa_runtime_options_init(opts)
        opts.backend = _enum("backend", backend, Backend)
        opts.num_threads = _int("threads", threads, 0, (1 << 31) - 1)
        opts.device = _int("device", device, 0, (1 << 31) - 1)
        if seed is not None:
            opts.seed = _int("seed", seed, 0, _U64)
        opts.device_kv_budget = _int("device_kv_budget", device_kv_budget, 0, _U64)
        opts.host_cache_bytes = _int("host_cache_bytes", host_cache_bytes, 0, _U64)
        opts.host_pool_bytes = _int("host_pool_bytes", host_pool_bytes, 0, _U64)
        opts.shard_tokens = _int("shard_tokens", shard_tokens, 0, _U64)
        device_list = None  # kept alive through the call
        if devices is not None:
            ordinals = [_int("devices[]", d, -(1 << 31), (1 << 31) - 1) for d in devices]
            device_list = ffi.new("int32_t[]", max(1, len(ordinals)))
            for i, d in enumerate(ordinals):
                device_list[i] = d
            opts.devices = device_list
            opts.n_devices = len(ordinals)
        if collective is not None:
            opts.collective = collective.table
        self._collective = collective  # its callbacks must outlive the runtime
        out = ffi.new("ssa_runtime **")
        self._lock = threading.Lock()
        self._sessions = 0
        self._close_requested = False
        self._ptr = ffi.NULL
        check(lib.ssa_runtime_create(opts, out), "ssa_runtime_create")
        self._ptr = out[0]
        self._device = opts.device
        self._backend = Backend(lib.ssa_runtime_backend(self._ptr)).name.lower()
        self._options = dict(backend=self._backend, threads=self.threads, seed=seed, device=int(opts.device),
                             device_kv_budget=int(opts.device_kv_budget),
                             host_cache_bytes=int(opts.host_cache_bytes),
                             host_pool_bytes=int(opts.host_pool_bytes),
                             devices=None if devices is None else tuple(ordinals),
                             shard_tokens=int(opts.shard_tokens))

    # -- lifetime
    def _acquire(self) -> None:
        with self._lock:
            if self._ptr == ffi.NULL or self._close_requested:
                raise invalid("runtime is closed")
            self._sessions += 1

    def _release(self) -> None:
        with self._lock:
            self._sessions -= 1
            destroy = self._close_requested and self._sessions == 0
        if destroy:
            self._destroy()

    def _destroy(self) -> None:
        with self._lock:
            ptr, self._ptr = self._ptr, ffi.NULL
        if ptr != ffi.NULL:
            lib.ssa_runtime_destroy(ptr)

    def close(self) -> None:
        """Frees the runtime now, or as soon as its last session is closed. Idempotent."""
        with self._lock:
            self._close_requested = True
            destroy = self._sessions == 0
        if destroy:
            self._destroy()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._close_requested or self._ptr == ffi.NULL

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if getattr(self, "_ptr", ffi.NULL) != ffi.NULL and self._sessions == 0:
                self._destroy()
        except Exception:
            pass

    def _handle(self):
        if self._ptr == ffi.NULL or self._close_requested:
            raise invalid("runtime is closed")
        return self._ptr

    # -- properties
    @property
    def backend(self) -> str:
        """The backend actually used: "cpu" or "cuda" (also after close(): the
        runtime's sessions may still be in use)."""
        return self._backend

    @property
    def threads(self) -> int:
        """Number of CPU worker threads (>= 1)."""
        return int(lib.ssa_runtime_num_threads(self._handle()))

    @property
    def shards(self) -> int:
        """Number of shards (devices) every session of the runtime is split over (>= 1)."""
        return int(lib.ssa_runtime_num_shards(self._handle()))

    @property
    def rank(self) -> int:
        """This process's rank in the runtime's group (``collective``); 0 without one."""
        return int(lib.ssa_runtime_rank(self._handle()))

    @property
    def device(self) -> int:
        """CUDA device ordinal whose memory K, V, q and out are: ``device``, or the
        first of ``devices`` for a sharded CUDA runtime."""
        devs = self._options["devices"]
        if devs and self._options["backend"] == "cuda":
            return devs[0]
        return self._device

    @property
    def options(self) -> dict:
        """The options the runtime was created with (backend as resolved, threads as
        used): backend, threads, seed, device, device_kv_budget, host_cache_bytes,
        host_pool_bytes, devices, shard_tokens."""
        return dict(self._options)

    def __repr__(self) -> str:
        if self.closed:
            return "<ssa.Runtime closed>"
        o = self._options
        extra = ""
        if o["device_kv_budget"]:
            extra += " device_kv_budget=%d" % o["device_kv_budget"]
        if o["host_pool_bytes"]:
            extra += " host_pool_bytes=%d" % o["host_pool_bytes"]
        if o["devices"] is not None:
            extra += " devices=%s" % (list(o["devices"]),)
        return "<ssa.Runtime backend=%s threads=%d%s>" % (self.backend, self.threads, extra)

    # -- sessions
    def create_session(self, n_layers: int, n_q_heads: int, n_kv_heads: int, head_dim: int,
                       dtype: Any = "float16", *, pq_subspaces: Optional[int] = None,
                       pq_centroids: Optional[int] = None, model_fingerprint: int = 0,
                       page_tokens: Optional[int] = None, host_pointers: bool = False,
                       index_min_tokens: Optional[int] = None, index_regrow_factor: Optional[float] = None,
                       index_train_sample: Optional[int] = None,
                       index_iterations: Optional[int] = None, proxy: Any = None,
                       pq_parallel_weight: Optional[float] = None) -> "Session":
        """Creates an empty session (one sequence, all layers of a model) on this runtime.

        Args:
            n_layers, n_q_heads, n_kv_heads, head_dim: the model's attention shape
                (n_q_heads a multiple of n_kv_heads; head_dim 32..512, a multiple of 8).
            dtype: "float16" (default), "bfloat16" or "float32" (also numpy dtypes);
                the dtype of K, V, q and out.
            pq_subspaces, pq_centroids: PQ index shape (library defaults 16 and 256).
            model_fingerprint: opaque 64-bit value checked when a snapshot is loaded.
            page_tokens: tokens per KV page (power of two 16..4096; default 256).
            host_pointers: for CUDA sessions, take host arrays instead of device arrays.
            index_*: PQ index policy (see ssa_session_config in ssa.h).
            proxy: "pq" (default), "opq" (a learned rotation before PQ), "pq4"
                (4-bit codes: pq_centroids <= 16, an even pq_subspaces; 32 x 16
                costs PQ's 16 bytes), "opq4" (both), "qpq" (a transform learned
                from the queries shown with Session.observe_queries) or "qpq4".
                Every proxy runs on both backends; a CUDA runtime of several
                devices or processes takes "pq" only (others: ssa.Unsupported).
            pq_parallel_weight: the score-aware loss's weight (1: squared error,
                the default; > 1 weighs each key's quantisation error along the key
                that much more; CPU runtimes only above 1).
        """
        cfg = _session_config(n_layers, n_q_heads, n_kv_heads, head_dim, dtype, pq_subspaces=pq_subspaces,
                              pq_centroids=pq_centroids, model_fingerprint=model_fingerprint,
                              page_tokens=page_tokens, host_pointers=host_pointers,
                              index_min_tokens=index_min_tokens, index_regrow_factor=index_regrow_factor,
                              index_train_sample=index_train_sample, index_iterations=index_iterations,
                              proxy=proxy, pq_parallel_weight=pq_parallel_weight)
        out = ffi.new("ssa_session **")
        check(lib.ssa_session_create(self._handle(), cfg, out), "ssa_session_create")
        return Session._adopt(self, out[0])

    def load(self, path: PathLike, verify: bool = False, mmap: bool = False,
             expect: Optional[dict] = None) -> "Session":
        """Restores a session saved with Session.save/checkpoint onto this runtime.

        On a group's runtime (``ssa.distributed``) a collective call: every rank loads the
        same snapshot (a group's manifest or one process's file) and keeps its shard's pages.

        Args:
            path: the snapshot file, or the manifest a group saved to.
            verify: verify every checksum up front (default: on read).
            mmap: map the file instead of reading it (CPU sessions).
            expect: the shape the snapshot must have, as create_session's arguments
                (n_layers, n_q_heads, n_kv_heads, head_dim, dtype, pq_subspaces,
                pq_centroids, model_fingerprint; omitted ones take create_session's
                defaults). Checked before any page is read (ssa_session_load_checked);
                a snapshot of another shape or model raises ssa.Mismatch naming the field.
        Raises ssa.IOError, ssa.Corrupt, ssa.Version, ssa.Mismatch, ssa.Unsupported, ...
        """
        flags = (lib.SSA_LOAD_VERIFY if verify else 0) | (lib.SSA_LOAD_MMAP if mmap else 0)
        out = ffi.new("ssa_session **")
        if expect is None:
            check(lib.ssa_session_load(self._handle(), _path(path), flags, out), "ssa_session_load")
        else:
            cfg = _session_config(**expect)
            check(lib.ssa_session_load_checked(self._handle(), _path(path), flags, cfg, out),
                  "ssa_session_load_checked")
        return Session._adopt(self, out[0])

    def decode_batch(self, items: Iterable[Sequence[Any]], layer: int, method: Any = "ssa",
                     sparsity: float = 50.0, budget: Optional[int] = None, heavy_fraction: float = 0.4,
                     n_sink: int = 128, n_local: int = 128, seed: Optional[int] = None, step: int = 0,
                     pi_min: Optional[float] = None, stream: Any = None, target_error: Optional[float] = None,
                     target_delta: Optional[float] = None, max_budget: Optional[int] = None,
                     group_selection: Any = "off") -> List[Any]:
        """Decodes many sessions of this runtime at one layer in one call.

        Args:
            items: (session, q) or (session, q, out) tuples; q and out are
                [n_q_heads, head_dim] arrays of that session's dtype. A session may
                appear more than once.
            layer and the rest: as Session.decode.
        Returns the list of outputs, in item order (the given `out` arrays, or new ones).
        """
        items = list(items)
        layer = _int("layer", layer, 0, _U32)
        params = _decode_params(method, sparsity, budget, heavy_fraction, n_sink, n_local, seed, step,
                                pi_min, stream, target_error, target_delta, max_budget,
                                group_selection)
        c_items = ffi.new("ssa_decode_item[]", max(len(items), 1))
        refs, outs = [], []
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise invalid("items[%d] must be (session, q) or (session, q, out)" % i)
            session, q = item[0], item[1]
            out = item[2] if len(item) == 3 else None
            if not isinstance(session, Session):
                raise invalid("items[%d][0] must be an ssa.Session, got %s" % (i, type(session).__name__))
            if session._runtime is not self:
                raise invalid("items[%d]: session belongs to another runtime" % i)
            qr, outr = session._decode_arrays("items[%d]" % i, q, out)
            c_items[i].session = session._handle()
            c_items[i].q = qr.ptr
            c_items[i].out = outr.ptr
            refs.append((qr, outr))
            outs.append(outr.obj)
        check(lib.ssa_decode_batch(c_items, len(items), layer, params), "ssa_decode_batch")
        return outs

    def _step_batch_pointers(self, sessions, k: int, v: int, q: int, out: int, kv_stride: int, q_stride: int,
                             layer: int, params) -> None:
        """ssa_decode_step_batch of sessions on rows of contiguous [batch, ...] arrays
        at raw addresses (row b at base + b * stride bytes): for a caller that already
        checked its arrays (ssa.hf)."""
        n = len(sessions)
        items = ffi.new("ssa_decode_step_item[]", n)
        for b, s in enumerate(sessions):
            items[b].session = s._handle()
            items[b].k = ffi.cast("const void *", k + b * kv_stride)
            items[b].v = ffi.cast("const void *", v + b * kv_stride)
            items[b].q = ffi.cast("const void *", q + b * q_stride)
            items[b].out = ffi.cast("void *", out + b * q_stride)
        check(lib.ssa_decode_step_batch(items, n, layer, params, ffi.NULL), "ssa_decode_step_batch")

    def decode_step_batch(self, items: Iterable[Sequence[Any]], layer: int, method: Any = "ssa",
                          sparsity: float = 50.0, budget: Optional[int] = None, heavy_fraction: float = 0.4,
                          n_sink: int = 128, n_local: int = 128, seed: Optional[int] = None, step: int = 0,
                          pi_min: Optional[float] = None, stream: Any = None, group_selection: Any = "off",
                          stats: bool = False):
        """One token of a generation loop for many sessions at one layer
        (ssa_decode_step_batch): each item's k and v appended, then its q decoded.

        Args:
            items: (session, k, v, q) or (session, k, v, q, out) tuples, each session
                once; k, v: [n_kv_heads, head_dim]; q, out: [n_q_heads, head_dim].
            layer and the rest: as Session.decode_step; stats are summed over the items.
        Returns the list of outputs in item order, and the DecodeStats when stats is true."""
        items = list(items)
        layer = _int("layer", layer, 0, _U32)
        params = _decode_params(method, sparsity, budget, heavy_fraction, n_sink, n_local, seed, step,
                                pi_min, stream, None, None, None, group_selection)
        c_items = ffi.new("ssa_decode_step_item[]", max(len(items), 1))
        refs, outs = [], []
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) not in (4, 5):
                raise invalid("items[%d] must be (session, k, v, q) or (session, k, v, q, out)" % i)
            session = item[0]
            if not isinstance(session, Session):
                raise invalid("items[%d][0] must be an ssa.Session, got %s" % (i, type(session).__name__))
            if session._runtime is not self:
                raise invalid("items[%d]: session belongs to another runtime" % i)
            c = session._config
            shape = (c.n_kv_heads, c.head_dim)
            kr = session._array("items[%d] k" % i, item[1], shape, False)
            vr = session._array("items[%d] v" % i, item[2], shape, False)
            qr, outr = session._decode_arrays("items[%d]" % i, item[3], item[4] if len(item) == 5 else None)
            c_items[i].session = session._handle()
            c_items[i].k, c_items[i].v = kr.ptr, vr.ptr
            c_items[i].q, c_items[i].out = qr.ptr, outr.ptr
            refs.append((kr, vr, qr, outr))
            outs.append(outr.obj)
        st = ffi.NULL
        if stats:
            st = ffi.new("ssa_decode_stats *")
            lib.ssa_decode_stats_init(st)
        check(lib.ssa_decode_step_batch(c_items, len(items), layer, params, st), "ssa_decode_step_batch")
        if stats:
            return outs, DecodeStats._from_c(st)
        return outs


class Session:
    """One long-lived KV store: one sequence, all layers of a model.

    Create with Runtime.create_session, Runtime.load or Session.fork. Decodes may run
    from many threads at once; append/update_index/truncate take the session
    exclusively (the library waits for running decodes). close() must not race with
    other calls on the same session. ``len(session)`` is the number of tokens present
    in every layer.
    """

    def __init__(self, *a, **k):
        raise TypeError("use Runtime.create_session, Runtime.load or Session.fork")

    @classmethod
    def _adopt(cls, runtime: Runtime, ptr) -> "Session":
        self = object.__new__(cls)
        self._ptr = ffi.NULL
        try:
            runtime._acquire()
        except Exception:
            lib.ssa_session_destroy(ptr)
            raise
        self._runtime = runtime
        self._ptr = ptr
        cfg = ffi.new("ssa_session_config *")
        lib.ssa_session_config_init(cfg)
        check(lib.ssa_session_get_config(ptr, cfg), "ssa_session_get_config")
        self._config = SessionConfig._from_c(cfg)
        device_ptrs = (runtime.backend == "cuda" and not (cfg.flags & lib.SSA_SESSION_HOST_POINTERS))
        self._device_ptrs = device_ptrs
        return self

    # -- lifetime
    def close(self) -> None:
        """Frees the session (and, if the runtime was closed, the runtime once unused). Idempotent."""
        ptr = getattr(self, "_ptr", ffi.NULL)
        if ptr != ffi.NULL:
            self._ptr = ffi.NULL
            lib.ssa_session_destroy(ptr)
            self._runtime._release()

    @property
    def closed(self) -> bool:
        return self._ptr == ffi.NULL

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if self._ptr == ffi.NULL:
            raise invalid("session is closed")
        return self._ptr

    # -- shape
    @property
    def runtime(self) -> Runtime:
        """The runtime this session lives on (kept alive by the session)."""
        return self._runtime

    @property
    def config(self) -> SessionConfig:
        """The configuration as the library resolved it."""
        return self._config

    @property
    def dtype(self) -> str:
        """"float16", "bfloat16" or "float32"."""
        return _arrays.DTYPE_NAMES[int(self._config.dtype)]

    @property
    def device_pointers(self) -> bool:
        """True when arrays must be device memory (CUDA session without host_pointers)."""
        return self._device_ptrs

    def __len__(self) -> int:
        self._commit_steps()
        return int(lib.ssa_session_length(self._handle()))

    def layer_length(self, layer: int) -> int:
        """Tokens present in one layer (decode steps still queued on the device included)."""
        layer = _int("layer", layer, 0, _U32)
        if layer >= self._config.n_layers:
            raise invalid("layer %d >= n_layers %d" % (layer, self._config.n_layers))
        self._commit_steps()
        return int(lib.ssa_session_layer_length(self._handle(), layer))

    def _commit_steps(self) -> None:
        # The C lengths count the decode steps committed so far; Python counts every
        # step queued (a wait for the device; a no-op without a reservation). Steps
        # that did nothing stay counted for sync().
        if self._device_ptrs:
            check(lib.ssa_session_sync(self._handle(), ffi.NULL), "ssa_session_sync")

    def __repr__(self) -> str:
        if self.closed:
            return "<ssa.Session closed>"
        c = self._config
        return "<ssa.Session %d tokens, %d layers, %dq/%dkv heads x %d, %s>" % (
            len(self), c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim, self.dtype)

    def _array(self, name: str, x: Any, shape, writable: bool):
        dt = int(self._config.dtype)
        if self._device_ptrs:
            return _arrays.device_array(name, x, dt, shape, writable, self._runtime.device)
        return _arrays.host_array(name, x, dt, shape, writable)

    def _check_layer(self, layer: Any) -> int:
        layer = _int("layer", layer, 0, _U32)
        return layer

    # -- mutations
    def _append_args(self, layer: Any, k: Any, v: Any):
        """The checked layer, k and v array views and token count of an append."""
        c = self._config
        layer = self._check_layer(layer)
        kr = self._array("k", k, (None, c.n_kv_heads, c.head_dim), False)
        n = int(kr.obj.shape[0])
        vr = self._array("v", v, (n, c.n_kv_heads, c.head_dim), False)
        return layer, kr, vr, n

    def append(self, layer: int, k: Any, v: Any) -> None:
        """Appends tokens to one layer.

        Args:
            layer: 0 <= layer < n_layers.
            k, v: arrays of shape [n_tokens, n_kv_heads, head_dim] in the session's
                dtype, C-contiguous; numpy for host sessions, device arrays for CUDA ones.
        All-or-nothing; takes the session exclusively.
        """
        layer, kr, vr, n = self._append_args(layer, k, v)
        if n == 0:
            return
        check(lib.ssa_session_append(self._handle(), layer, kr.ptr, vr.ptr, n), "ssa_session_append")

    def append_async(self, layer: int, k: Any, v: Any, stream: Any = None) -> None:
        """append, queued on a CUDA stream instead of waiting (ssa_session_append_async).

        Args:
            layer, k, v: as append.
            stream: CUDA stream (int handle or torch.cuda.Stream); None: the legacy
                default stream.
        For CUDA sessions fed device arrays it returns once the copy is queued on
        `stream`: keep k and v alive and unchanged until the stream gets there, and
        k and v are not scanned for NaN/Inf (a non-finite value is stored and makes
        the decodes that read it meaningless). Appends that (re)train the index and
        host_pointers sessions wait for the stream and append as append does.
        CPU sessions: the same as append (stream is not used).
        """
        layer, kr, vr, n = self._append_args(layer, k, v)
        st = _stream_ptr(stream)
        if n == 0:
            return
        check(lib.ssa_session_append_async(self._handle(), layer, kr.ptr, vr.ptr, n, st),
              "ssa_session_append_async")

    def observe_queries(self, layer: int, q: Any) -> None:
        """Shows a layer queries for the query-aware proxies ("qpq", "qpq4") to learn
        their transform from (ssa_session_observe_queries); the layer's next index
        training uses every query observed so far.

        Args:
            layer: 0 <= layer < n_layers.
            q: [n, n_q_heads, head_dim] in the session's dtype, C-contiguous.
        """
        c = self._config
        layer = self._check_layer(layer)
        qr = self._array("q", q, (None, c.n_q_heads, c.head_dim), False)
        n = int(qr.obj.shape[0])
        if n == 0:
            return
        check(lib.ssa_session_observe_queries(self._handle(), layer, qr.ptr, n), "ssa_session_observe_queries")

    def update_index(self) -> None:
        """(Re)trains the PQ codebooks of every non-empty layer and re-encodes all codes."""
        check(lib.ssa_session_update_index(self._handle()), "ssa_session_update_index")

    def truncate(self, n_tokens: int) -> None:
        """Keeps the first n_tokens tokens of every layer (agent rollback)."""
        n = _int("n_tokens", n_tokens, 0, _U64)
        check(lib.ssa_session_truncate(self._handle(), n), "ssa_session_truncate")

    def fork(self) -> "Session":
        """An independent copy sharing pages copy-on-write (cheap)."""
        out = ffi.new("ssa_session **")
        check(lib.ssa_session_fork(self._handle(), out), "ssa_session_fork")
        return Session._adopt(self._runtime, out[0])

    # -- decode
    def _decode_arrays(self, prefix: str, q: Any, out: Any):
        c = self._config
        shape = (c.n_q_heads, c.head_dim)
        qr = self._array(prefix + "q" if not prefix else prefix + " q", q, shape, False)
        if out is None:
            if self._device_ptrs:
                out = _arrays.new_device("out", q, shape)
            else:
                out = _arrays.new_host(int(c.dtype), shape, like=q)
        outr = self._array(prefix + "out" if not prefix else prefix + " out", out, shape, True)
        if _arrays.overlaps(q, out):
            raise invalid("q and out must not overlap")
        if not self._device_ptrs and isinstance(q, _arrays.np.ndarray) and isinstance(out, _arrays.np.ndarray) \
                and q.dtype != out.dtype:
            raise invalid("out has dtype %s but q has %s" % (out.dtype, q.dtype))
        return qr, outr

    def decode(self, layer: int, q: Any, method: Any = "ssa", sparsity: float = 50.0,
               budget: Optional[int] = None, heavy_fraction: float = 0.4, n_sink: int = 128,
               n_local: int = 128, seed: Optional[int] = None, step: int = 0, out: Any = None,
               stats: bool = False, pi_min: Optional[float] = None, stream: Any = None,
               target_error: Optional[float] = None, target_delta: Optional[float] = None,
               max_budget: Optional[int] = None, group_selection: Any = "off"):
        """Attention output of one layer for one new query.

        Args:
            layer: the layer to attend over (all of its tokens).
            q: [n_q_heads, head_dim] in the session's dtype.
            method: "dense", "oracle_topk", "pq_topk", "hybrid_uniform", "sampling",
                "ssa" (default) or "ssa_adaptive" (or ssa.Method).
            sparsity: N / budget when budget is None (>= 1).
            budget: tokens read per query head including sink and local tokens.
            heavy_fraction: h for "ssa" and "hybrid_uniform", in [0, 1].
            n_sink, n_local: tokens always read at the start and the end.
            seed: sampling seed (None: the runtime's seed); step: RNG counter.
                The same (seed, step, inputs) give bitwise the same output.
            out: optional [n_q_heads, head_dim] array to write; allocated if None.
            stats: also return an ssa.DecodeStats.
            pi_min: lower clamp of inclusion probabilities (None: library default).
            stream: CUDA stream (int handle or torch.cuda.Stream) for CUDA sessions.
            target_error: error-targeted decode ("ssa" and "ssa_adaptive"; decode_batch of CUDA sessions refuses it):
                instead of a fixed budget each head reads as many rows as it predicts it
                needs for ||out - exact|| <= target_error * ||exact|| with probability
                >= 1 - target_delta (see ssa.h). None or 0: off. `budget` is then the
                floor of the chosen budget and `sparsity` is not used.
            target_delta: allowed failure probability, in (0, 1) (None: 0.1).
            max_budget: cap on each head's chosen budget in tokens (None or 0: N / 5, at
                least the floor); DecodeStats.capped_heads counts heads it stopped.
            group_selection: "off" (default), "mixture" or "mean_query" (or
                ssa.GroupSelection): one selection per KV head shared by its query
                heads (docs/GROUP_SELECTION.md).
        Returns out, or (out, DecodeStats) when stats is true.
        """
        layer = self._check_layer(layer)
        params = _decode_params(method, sparsity, budget, heavy_fraction, n_sink, n_local, seed, step,
                                pi_min, stream, target_error, target_delta, max_budget,
                                group_selection)
        qr, outr = self._decode_arrays("", q, out)
        st = ffi.NULL
        if stats:
            st = ffi.new("ssa_decode_stats *")
            lib.ssa_decode_stats_init(st)
        check(lib.ssa_decode(self._handle(), layer, qr.ptr, outr.ptr, params, st), "ssa_decode")
        if stats:
            return outr.obj, DecodeStats._from_c(st)
        return outr.obj

    def decode_traced(self, layer: int, q: Any, method: Any = "ssa", sparsity: float = 50.0,
                      budget: Optional[int] = None, heavy_fraction: float = 0.4, n_sink: int = 128,
                      n_local: int = 128, seed: Optional[int] = None, step: int = 0, out: Any = None,
                      pi_min: Optional[float] = None, target_error: Optional[float] = None,
                      target_delta: Optional[float] = None, max_budget: Optional[int] = None,
                      group_selection: Any = "off", log_pi: bool = False):
        """decode() that also returns the rows each query head read (CPU sessions).

        Arguments as decode() (no stream: CUDA sessions raise ssa.Unsupported).
        log_pi: also return each row's log inclusion probability.
        The output and stats are bitwise those of decode() with the same arguments.
        Returns (out, DecodeStats, DecodeTrace)."""
        layer = self._check_layer(layer)
        params = _decode_params(method, sparsity, budget, heavy_fraction, n_sink, n_local, seed, step,
                                pi_min, None, target_error, target_delta, max_budget, group_selection)
        qr, outr = self._decode_arrays("", q, out)
        np = _arrays.np
        # n_q_heads rows per token of the layer always suffice (ssa.h); the result is
        # cut to what was read.
        capacity = self._config.n_q_heads * self.layer_length(layer)
        tokens = np.empty(capacity, dtype=np.uint32)
        lp = np.empty(capacity, dtype=np.float32) if log_pi else None
        offsets = np.zeros(self._config.n_q_heads + 1, dtype=np.uint64)
        st = ffi.new("ssa_decode_stats *")
        lib.ssa_decode_stats_init(st)
        check(lib.ssa_decode_traced(self._handle(), layer, qr.ptr, outr.ptr, params, st,
                                    ffi.cast("uint32_t *", tokens.ctypes.data),
                                    ffi.cast("float *", lp.ctypes.data) if log_pi else ffi.NULL,
                                    capacity, ffi.cast("uint64_t *", offsets.ctypes.data)),
              "ssa_decode_traced")
        n = int(offsets[-1])
        trace = DecodeTrace(tokens[:n].copy(), offsets, lp[:n].copy() if log_pi else None)
        return outr.obj, DecodeStats._from_c(st), trace

    # -- decode steps (a generation loop's append + decode, capturable on CUDA)
    def reserve(self, n_tokens: int) -> None:
        """Reserves room for n_tokens more tokens on every layer (ssa_session_reserve).

        CUDA sessions: the pages, device lengths and tables that decode_step then
        uses on the device, so that a CUDA graph can capture a step once and
        replay it for every token. Ends an earlier reservation. CPU sessions:
        checks the argument and reserves nothing (their steps run eagerly)."""
        n = _int("n_tokens", n_tokens, 1, _U64)
        check(lib.ssa_session_reserve(self._handle(), n), "ssa_session_reserve")

    def prefetch(self, n_tokens: int = 0) -> None:
        """Starts this session's turn ahead of its next reserve (ssa_session_prefetch).

        On a runtime with a device budget whose sessions take turns: idle sessions
        give up device pages (room kept for n_tokens new tokens per layer) and this
        session's host pages start crossing to the device on a stream of the
        library's, while another session decodes; its next reserve waits for the
        copies and takes them in. Call it for the next session once the current
        one holds its reservation. Nothing to do elsewhere (no budget, CPU, a
        session holding a reservation)."""
        n = _int("n_tokens", n_tokens, 0, _U64)
        check(lib.ssa_session_prefetch(self._handle(), n), "ssa_session_prefetch")

    def sync(self) -> int:
        """Waits for queued decode steps and commits their tokens (ssa_session_sync).

        Returns the number of steps that did nothing since the last call (graph
        replays after the reservation ended, or past its capacity)."""
        dropped = ffi.new("uint64_t *")
        check(lib.ssa_session_sync(self._handle(), dropped), "ssa_session_sync")
        return int(dropped[0])

    def decode_step(self, layer: int, k: Any, v: Any, q: Any, method: Any = "ssa", sparsity: float = 50.0,
                    budget: Optional[int] = None, heavy_fraction: float = 0.4, n_sink: int = 128,
                    n_local: int = 128, seed: Optional[int] = None, step: int = 0, out: Any = None,
                    stats: bool = False, pi_min: Optional[float] = None, stream: Any = None,
                    group_selection: Any = "off"):
        """One token of a generation loop (ssa_decode_step): k and v appended to the
        layer, then the layer decoded with q, in one native call.

        Args:
            k, v: [n_kv_heads, head_dim] (or [1, n_kv_heads, head_dim]) of the new token.
            q, out and the rest: as decode(). The RNG step used is step + the new
                token's position (the layer's length before the append).
        After reserve() on a CUDA session the step runs on the device from device
        lengths and can be captured into a CUDA graph (stream: the capturing
        stream; stats must be False while capturing); session lengths then lag
        until the next call on the session or sync(). Without a reservation (and
        on CPU sessions) it is append_async + decode.
        Returns out, or (out, DecodeStats) when stats is true."""
        layer = self._check_layer(layer)
        c = self._config
        params = _decode_params(method, sparsity, budget, heavy_fraction, n_sink, n_local, seed, step,
                                pi_min, stream, None, None, None, group_selection)
        shape = (c.n_kv_heads, c.head_dim)
        if getattr(k, "ndim", 2) == 3:
            shape = (1, c.n_kv_heads, c.head_dim)
        kr = self._array("k", k, shape, False)
        vr = self._array("v", v, shape, False)
        qr, outr = self._decode_arrays("", q, out)
        st = ffi.NULL
        if stats:
            st = ffi.new("ssa_decode_stats *")
            lib.ssa_decode_stats_init(st)
        check(lib.ssa_decode_step(self._handle(), layer, kr.ptr, vr.ptr, qr.ptr, outr.ptr, params, st),
              "ssa_decode_step")
        if stats:
            return outr.obj, DecodeStats._from_c(st)
        return outr.obj

    def _step_pointers(self, layer: int, k: int, v: int, q: int, out: int, params, stats) -> None:
        """ssa_decode_step on raw addresses with a prepared parameter struct: for a
        caller that already checked its arrays (ssa.hf, once per layer and token)."""
        check(lib.ssa_decode_step(self._handle(), layer, ffi.cast("const void *", k), ffi.cast("const void *", v),
                                  ffi.cast("const void *", q), ffi.cast("void *", out), params, stats),
              "ssa_decode_step")

    # -- snapshots
    def save(self, path: PathLike) -> None:
        """Writes the whole session to path atomically (runs beside decodes).

        On a group's runtime (``ssa.distributed``) a collective call: every rank passes the
        same path; each writes its shard's file beside it and rank 0 commits the set by
        writing the manifest at path, which loads into a group of any size or one process.
        """
        check(lib.ssa_session_save(self._handle(), _path(path)), "ssa_session_save")

    def checkpoint(self, path: PathLike) -> None:
        """Appends only what changed since the last save/checkpoint to path, atomically
        (a full save when path holds no snapshot of this session; on a group's runtime
        always a full save of the set, as ``save``)."""
        check(lib.ssa_session_checkpoint(self._handle(), _path(path)), "ssa_session_checkpoint")
