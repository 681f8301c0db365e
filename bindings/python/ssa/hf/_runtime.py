"""Which libssa runtime an SSACache's sessions live on.

Without ``runtime=`` a cache opens a runtime of its own at its first update (or load),
with default options on the backend and device of the model's tensors. With
``runtime=`` (an ssa.Runtime built with any options: a device budget and host cache
for tiered K/V, devices for shards, threads, seed) the cache's sessions are made on
that runtime, so many caches and batches share its memory budget, pools and threads.
A cache and a runtime that do not fit together are refused with a message that
names the option to change.
"""
from typing import Optional, Tuple

import torch

from .. import _core
from .._errors import invalid


def check_given(runtime, backend: str, threads) -> Optional[_core.Runtime]:
    """The runtime passed to SSACache(runtime=...), checked against the cache's own
    runtime options (backend, threads), or None."""
    if runtime is None:
        return None
    if not isinstance(runtime, _core.Runtime):
        raise invalid("SSACache(runtime=...) takes an ssa.Runtime, got %s" % type(runtime).__name__)
    if runtime.closed:
        raise invalid("SSACache(runtime=...): the runtime is closed")
    if backend != "auto" and backend != runtime.backend:
        raise invalid("SSACache(backend=%r) does not fit the runtime, whose backend is %r "
                      "(ssa.Runtime(backend=...)); leave backend=\"auto\" with runtime=" % (backend, runtime.backend))
    if threads:
        raise invalid("SSACache(threads=%r) with runtime=: threads are the runtime's option "
                      "(ssa.Runtime(threads=...)); leave threads=0" % (threads,))
    return runtime


def check_storage(page_tokens) -> dict:
    """The storage settings of a cache's new sessions (create_session's keywords)."""
    if page_tokens is None:
        return {}
    if isinstance(page_tokens, bool) or not isinstance(page_tokens, int) or not 16 <= page_tokens <= 4096 \
            or page_tokens & (page_tokens - 1):
        raise invalid("SSACache(page_tokens=%r): a power of two in [16, 4096] (or None)" % (page_tokens,))
    return {"page_tokens": page_tokens}


def check_proxy(proxy) -> dict:
    """The proxy settings of a cache's new sessions (create_session's keywords):
    4-bit proxies at PQ's default bytes (32 subspaces x 16 centroids)."""
    if proxy is None:
        return {}
    names = ("pq", "opq", "pq4", "opq4", "qpq", "qpq4")
    if not isinstance(proxy, str) or proxy.lower() not in names:
        raise invalid("SSACache(proxy=%r): one of %s (or None)" % (proxy, ", ".join(repr(n) for n in names)))
    proxy = proxy.lower()
    if proxy.endswith("4"):
        return {"proxy": proxy, "pq_subspaces": 32, "pq_centroids": 16}
    return {"proxy": proxy}


def runtime_device(runtime: _core.Runtime) -> torch.device:
    """Where the runtime's sessions take K, V, q and out: the CUDA device of the
    runtime (the first of its devices when sharded), or the CPU."""
    if runtime.backend == "cuda":
        return torch.device("cuda", runtime.device)
    return torch.device("cpu")


def backend_for(cache, tensor_device: torch.device, layer_idx: int) -> str:
    """The backend of the sessions a cache opens for tensors on tensor_device."""
    rt = cache._given_runtime
    if rt is None:
        backend = cache.backend
        if backend == "auto":
            backend = "cuda" if tensor_device.type == "cuda" else "cpu"
        if backend == "cuda" and tensor_device.type != "cuda":
            raise invalid("SSACache(backend=\"cuda\") got %s tensors; move the model to a CUDA device"
                          % tensor_device)
        return backend
    check_tensors(rt, tensor_device, "SSACache layer %d: key_states" % layer_idx)
    return rt.backend


def check_tensors(runtime: _core.Runtime, tensor_device: torch.device, what: str) -> None:
    """Refuses model tensors the runtime's sessions cannot take. A CPU runtime takes
    tensors of any device (copied to the host, as SSACache(backend="cpu") does); a
    CUDA runtime takes memory of its own device only."""
    if runtime.closed:
        raise invalid("%s: the cache's runtime is closed" % what)
    if runtime.backend != "cuda":
        return
    want = runtime_device(runtime)
    if tensor_device.type != "cuda":
        raise invalid("%s on %s, but the runtime is a CUDA runtime on %s (ssa.Runtime(backend=\"cuda\")); "
                      "move the model to %s or use ssa.Runtime(backend=\"cpu\")" % (what, tensor_device, want, want))
    if tensor_device.index is not None and tensor_device.index != want.index:
        option = "devices[0]" if runtime.options.get("devices") else "device"
        raise invalid("%s on %s, but the runtime's sessions take memory of %s (ssa.Runtime(%s=%d)); "
                      "move the model there or build the runtime with %s=%d"
                      % (what, tensor_device, want, option, want.index, option, tensor_device.index))


def open_runtime(cache, backend: str, device: torch.device) -> Tuple[_core.Runtime, torch.device]:
    """The runtime a cache's sessions go to and the torch device of their memory."""
    rt = cache._given_runtime
    if rt is not None:
        check_tensors(rt, device, "SSACache: the model's tensors")
        return rt, runtime_device(rt)
    kw = dict(backend=backend, threads=cache.threads)
    if backend == "cuda":
        kw["device"] = device.index if device.index is not None else torch.cuda.current_device()
    rt = _core.Runtime(**kw)
    return rt, runtime_device(rt)


def load_target(cache, model, device) -> Tuple[str, torch.device]:
    """Backend and device of the sessions SSACache.load restores (device: load's
    argument or None for the model's)."""
    rt = cache._given_runtime
    if rt is not None:
        param = next(iter(model.parameters()), None)
        if param is not None:
            check_tensors(rt, param.device, "SSACache.load: the model's tensors")
        if device is not None:
            check_tensors(rt, torch.device(device), "SSACache.load(device=%r)" % (device,))
            return rt.backend, torch.device(device)
        return rt.backend, param.device if param is not None else runtime_device(rt)
    be = cache.backend
    if be == "auto":
        try:
            dev = next(model.parameters()).device
        except StopIteration:
            dev = torch.device("cpu")
        dev = torch.device(device) if device is not None else dev
        be = "cuda" if dev.type == "cuda" else "cpu"
    else:
        dev = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if be == "cuda" else torch.device("cpu"))
    return be, dev
