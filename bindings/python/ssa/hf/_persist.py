"""SSACache.save / SSACache.load: a folder with one libssa snapshot per batch row,
the sliding-window layers' K/V (torch tensors) and a JSON manifest."""
import json
import os
import tempfile

import torch

from .. import _core
from .._errors import Error, Mismatch, invalid
from . import _model, _params, _runtime

FORMAT = "ssa.hf.cache/1"
MANIFEST = "cache.json"
SLIDING = "sliding.pt"


def _row_file(b: int) -> str:
    return "row%d.ssa" % b


def _atomic_write(path: str, data: bytes) -> None:
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save(cache, path) -> None:
    path = os.fspath(path)
    if not cache.sessions:
        raise invalid("SSACache.save: the cache holds no tokens yet")
    for layer in cache.layers:
        if getattr(layer, "dense_k", None) is not None:
            # The prompt's dense copy is not saved: a loaded cache continues a prefill
            # token by token through libssa decode (exact with method "dense").
            break
    os.makedirs(path, exist_ok=True)
    if cache.runtime.backend == "cuda":
        torch.cuda.current_stream(cache.device).synchronize()  # queued appends land first
    cache._end_reservation()  # a checkpoint ends the sessions' reservations
    for b, s in enumerate(cache.sessions):
        s.checkpoint(os.path.join(path, _row_file(b)))
    sliding = {}
    for i, layer in enumerate(cache.layers):
        if cache.layer_of(i) is None:
            sliding[str(i)] = {"keys": None if layer.keys is None else layer.keys.detach().cpu(),
                               "values": None if layer.values is None else layer.values.detach().cpu(),
                               "cumulative_length": int(getattr(layer, "cumulative_length", 0))}
    if sliding:
        tmp = os.path.join(path, ".tmp-" + SLIDING)
        torch.save(sliding, tmp)
        os.replace(tmp, os.path.join(path, SLIDING))
    manifest = {
        "format": FORMAT,
        "fingerprint": cache.fingerprint,
        "model": cache._config_summary,
        "params": cache.params,
        # The sessions' storage as SSACache(page_tokens=, proxy=) set it; load makes
        # new sessions (after a reset) the same way and checks the rows against it.
        "storage": dict(cache._storage),
        "positions": cache.get_seq_length(),
        "batch": len(cache.sessions),
        "dtype": cache.dtype,
        "padded": cache._padded,
        "rows": [_row_file(b) for b in range(len(cache.sessions))],
        "sliding": SLIDING if sliding else None,
    }
    _atomic_write(os.path.join(path, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())


def _differences(saved: dict, now: dict) -> str:
    keys = sorted(set(saved) | set(now))
    diffs = ["%s %r vs %r" % (k, saved.get(k), now.get(k)) for k in keys if saved.get(k) != now.get(k)]
    return "; ".join(diffs[:6]) or "same summary, other fingerprint"


def _committed_positions(rows, sessions, positions: int) -> int:
    """The positions of an unpadded cache: the manifest's, or more when every row
    snapshot holds the same larger count. save() commits each row's snapshot
    (atomically) before it replaces the manifest, so rows ahead of the manifest are
    a save interrupted between the two, whose rows all landed: their state is the
    later one (each snapshot is a whole session, index included)."""
    lengths = [len(s) for s in sessions]
    if len(set(lengths)) == 1 and lengths[0] >= positions:
        return lengths[0]
    for r, n in zip(rows, lengths):
        if n != positions:
            raise invalid("SSACache.load: %s holds %d tokens, the manifest says %d (rows hold %s)"
                          % (r, n, positions, lengths))
    return positions


def _storage(manifest: dict, mpath: str) -> dict:
    """The manifest's storage settings, checked as SSACache checks its arguments;
    {} (the defaults) in manifests saved before they were recorded."""
    storage = manifest.get("storage", {})
    if not isinstance(storage, dict) or set(storage) - {"page_tokens", "proxy", "pq_subspaces", "pq_centroids"}:
        raise invalid("SSACache.load: %s has an invalid storage entry %r" % (mpath, storage))
    try:
        made = _runtime.check_storage(storage.get("page_tokens"))
        made.update(_runtime.check_proxy(storage.get("proxy")))
    except Error as e:
        raise invalid("SSACache.load: %s: storage %s" % (mpath, e.message)) from None
    if made != storage:
        raise invalid("SSACache.load: %s has storage %r, which no SSACache makes (%r)" % (mpath, storage, made))
    return made


def _row_error(e: Error, rpath: str) -> Error:
    """The library's error about a row snapshot, naming the row."""
    return type(e)("SSACache.load: %s: %s" % (rpath, e.message), e.status, e.function)


def _inspect(rpath: str):
    try:
        return _core.inspect(rpath)
    except Error as e:
        raise _row_error(e, rpath) from None


def _check_storage(session, storage: dict, rpath: str, mpath: str) -> None:
    """A row must hold the proxy and page size its manifest names."""
    c = session.config
    if "proxy" in storage and c.proxy.name.lower() != storage["proxy"]:
        raise invalid("SSACache.load: %s holds proxy %r, %s says %r"
                      % (rpath, c.proxy.name.lower(), mpath, storage["proxy"]))
    if "page_tokens" in storage and c.page_tokens != storage["page_tokens"]:
        raise invalid("SSACache.load: %s has page_tokens %d, %s says %d"
                      % (rpath, c.page_tokens, mpath, storage["page_tokens"]))


def load(cls, path, model, backend, observer, threads, device, runtime=None, group=None):
    path = os.fspath(path)
    mpath = os.path.join(path, MANIFEST)
    try:
        with open(mpath, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise invalid("SSACache.load: %s holds no saved cache (no %s)" % (path, MANIFEST)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid("SSACache.load: %s is not a valid manifest: %s" % (mpath, e)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise invalid("SSACache.load: %s has format %r, expected %r" % (
            mpath, manifest.get("format") if isinstance(manifest, dict) else None, FORMAT))
    fp = _model.fingerprint(model)
    if manifest.get("fingerprint") != fp:
        saved = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
        raise Mismatch("the cache in %s was saved for another model (%s); refusing to load it into this one"
                       % (path, _differences(saved, _model.config_summary(model))), None, "SSACache.load")
    params = manifest.get("params")
    if not isinstance(params, dict):
        raise invalid("SSACache.load: %s has no decode parameters" % mpath)
    rows = manifest.get("rows")
    positions = manifest.get("positions")
    dtype = manifest.get("dtype")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, str) and os.path.basename(r) == r
                                                           for r in rows):
        raise invalid("SSACache.load: %s lists no valid row snapshots" % mpath)
    if not isinstance(positions, int) or isinstance(positions, bool) or positions < 0:
        raise invalid("SSACache.load: %s has an invalid position count %r" % (mpath, positions))
    if dtype not in ("float32", "float16", "bfloat16"):
        raise invalid("SSACache.load: %s has an invalid dtype %r" % (mpath, dtype))
    params = _params.check(params)  # every value checked again
    storage = _storage(manifest, mpath)
    cache = cls(model, observer=observer, threads=threads, backend=backend, runtime=runtime, **params,
                page_tokens=storage.get("page_tokens"), proxy=storage.get("proxy"), **(group or {}))
    be, dev = _runtime.load_target(cache, model, device)
    cache._open(be, dtype, dev, 0)
    expect = cache._session_shape()
    if "storage" not in manifest:
        # Saved before the manifest recorded the storage: the PQ shape is the rows'
        # own (a 4-bit proxy's 32 x 16), which every row must then share.
        info = _inspect(os.path.join(path, rows[0]))
        expect.update(pq_subspaces=info.pq_subspaces, pq_centroids=info.pq_centroids)
    else:
        expect.update({k: storage[k] for k in ("pq_subspaces", "pq_centroids") if k in storage})
    sessions = []
    try:
        for r in rows:
            rpath = os.path.join(path, r)
            try:
                s = cache.runtime.load(rpath, expect=expect)
            except Error as e:
                raise _row_error(e, rpath) from None
            sessions.append(s)
            _check_storage(s, storage, rpath, mpath)
        if "storage" not in manifest:  # new sessions (after reset) as the rows were made
            cache._storage.update(_runtime.check_proxy(sessions[0].config.proxy.name))
        if manifest.get("padded") is False:
            positions = _committed_positions(rows, sessions, positions)
    except BaseException:
        for s in sessions:
            s.close()
        raise
    cache.sessions = sessions
    cache._padded = bool(manifest.get("padded"))
    for layer in cache.layers:
        if hasattr(layer, "seen"):
            layer.seen = positions
            layer.stepping = cache._stepping and positions > 0
            layer.is_initialized = True
    if manifest.get("sliding"):
        state = torch.load(os.path.join(path, SLIDING), map_location="cpu", weights_only=True)
        for i, layer in enumerate(cache.layers):
            if cache.layer_of(i) is not None:
                continue
            st = state.get(str(i)) if isinstance(state, dict) else None
            if not isinstance(st, dict):
                raise invalid("SSACache.load: %s has no state of sliding layer %d" % (SLIDING, i))
            k, v, n = st.get("keys"), st.get("values"), st.get("cumulative_length")
            if n != positions:
                raise invalid("SSACache.load: sliding layer %d saved at %r positions, the manifest says %d"
                              % (i, n, positions))
            if k is not None:
                want = (len(sessions), cache.shape.n_kv_heads, cache.shape.head_dim)
                if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor) or k.shape != v.shape \
                        or k.dim() != 4 or (k.shape[0], k.shape[1], k.shape[3]) != want \
                        or k.shape[2] > min(positions, layer.sliding_window):
                    raise invalid("SSACache.load: sliding layer %d K/V of shape %s do not fit [%d, %d, <= %d, %d]"
                                  % (i, tuple(getattr(k, "shape", ())), want[0], want[1],
                                     min(positions, layer.sliding_window), want[2]))
                if not (torch.isfinite(k).all() and torch.isfinite(v).all()):
                    raise invalid("SSACache.load: sliding layer %d K/V hold non-finite values" % i)
                layer.lazy_initialization(k.to(dev), v.to(dev))
                layer.keys, layer.values = k.to(dev), v.to(dev)
            layer.cumulative_length = positions
    elif any(cache.layer_of(i) is None for i in range(cache.shape.n_layers)):
        raise invalid("SSACache.load: the model has sliding-window layers but %s saved none" % path)
    return cache
