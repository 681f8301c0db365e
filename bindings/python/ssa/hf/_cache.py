"""SSACache: a transformers Cache whose full-attention layers live in libssa sessions."""
import math
import time
from typing import Any, Callable, Dict, List, Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

from .. import _core
from .._errors import Error, invalid
from . import _attention, _model, _params, _runtime, _steps

_TRAIN_AT_FIRST_DECODE = 0xFFFFFFFF  # index_min_tokens no append reaches
# Query-aware proxies learn from the prefill's last queries (per batch row, every
# query head): enough for a second moment of head_dim^2 entries to settle, cheap
# next to the prefill (head_dim^2 multiply-adds per query head and query).
_OBSERVED_PREFILL_QUERIES = 256
_TORCH_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _relabel(e: Error, where: str) -> Error:
    """The same libssa error, its message prefixed with where it happened."""
    return type(e)("%s: %s" % (where, e.message), e.status, e.function)


class SSALayer(CacheLayerMixin):
    """One full-attention layer of an SSACache. Its K/V live in session layer `slot` of
    each batch row's libssa session; during a prefill it also keeps the prompt's K/V
    as tensors (for the dense prefill attention), dropped at the first decode step."""

    is_sliding = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, cache: "SSACache", layer_idx: int, slot: int):
        super().__init__()
        self.cache = cache
        self.layer_idx = layer_idx
        self.slot = slot
        # Positions seen (padding included, as transformers counts them) are derived
        # from the sessions: row 0's stored tokens, plus the positions row 0 skipped
        # as padding, plus those handed to update() whose append has not run yet.
        # A compiled step appends on the device without running any of this code.
        self.pad0 = 0
        self.inflight = 0
        self.stepping = False  # a token is a decode step (update hands it over whole)
        self.dense_k: Optional[torch.Tensor] = None
        self.dense_v: Optional[torch.Tensor] = None

    @property
    def is_compileable(self) -> bool:
        return self.cache.is_compileable

    @property
    def seen(self) -> int:
        c = self.cache
        stored = c._length0(self.slot) if c.sessions else 0
        return self.pad0 + stored + self.inflight

    @seen.setter
    def seen(self, n: int) -> None:
        c = self.cache
        self.inflight = 0
        self.pad0 = int(n) - (c._length0(self.slot) if c.sessions else 0)

    def attend_step(self, query, key, value, kwargs):
        return attend_step(self, query, key, value, kwargs)

    def __repr__(self):
        return "SSALayer(%d -> session layer %d, %d tokens)" % (self.layer_idx, self.slot, self.seen)

    # -- CacheLayerMixin
    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # transformers < 5.16 name of get_max_length
        return -1

    def get_mask_sizes(self, query_length, *args) -> tuple:
        if isinstance(query_length, torch.Tensor):  # older transformers pass cache_position
            query_length = int(query_length.shape[0])
        if int(query_length) == 1 and self.stepping:
            # A decode step attends the new token's K/V (what update returns) and the
            # sessions behind it; the mask (of constant shape, so a compiled forward
            # keeps one graph) covers that token. generate builds it before every
            # step, so this is where the host checks the steps queued since the last
            # one and keeps room reserved for the next.
            self.cache._before_step()
            return 1, self.seen
        return self.seen + int(query_length), 0

    def reset(self) -> None:
        self.cache._reset()

    def crop(self, tokens_to_remove: int) -> None:
        self.cache._crop_from_layer(self, tokens_to_remove)

    def offload(self):
        pass

    def prefetch(self):
        pass

    def reorder_cache(self, beam_idx) -> None:
        self.cache._select_rows_from_layer(self, [int(i) for i in beam_idx.tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.cache._select_rows_from_layer(self, [b for b in range(self.cache.batch_size) for _ in range(repeats)])

    def batch_select_indices(self, indices) -> None:
        idx = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        self.cache._select_rows_from_layer(self, [int(i) for i in idx])

    def _check_kv(self, key_states, value_states) -> None:
        """Shapes, dtype and device of a layer's new K/V; opens the sessions at the first."""
        c = self.cache
        shape = c.shape
        if key_states.dim() != 4 or tuple(key_states.shape[1::2]) != (shape.n_kv_heads, shape.head_dim) \
                or value_states.shape != key_states.shape:
            raise invalid("SSACache layer %d: key_states %s and value_states %s, expected both "
                          "[batch, %d, n_tokens, %d]" % (self.layer_idx, tuple(key_states.shape),
                                                         tuple(value_states.shape), shape.n_kv_heads,
                                                         shape.head_dim))
        c._ensure_sessions(key_states, self.layer_idx)
        if key_states.shape[0] != c.batch_size:
            raise invalid("SSACache layer %d: key_states has batch %d, the cache holds %d sequences"
                          % (self.layer_idx, key_states.shape[0], c.batch_size))

    def update(self, key_states, value_states, *args, **kwargs):
        self._check_kv(key_states, value_states)
        t = int(key_states.shape[2])
        if t == 1 and self.stepping:
            # The whole token goes to the attention call: append and decode in one
            # native step there (no Python state changes here, so a compiled forward
            # has nothing to guard on but the shapes).
            _attention.set_pending_step(self)
            return key_states, value_states
        pos = self.seen
        if t > 1 and (pos == 0 or self.dense_k is not None):
            if self.dense_k is not None:
                key_states = torch.cat([self.dense_k, key_states], dim=-2)
                value_states = torch.cat([self.dense_v, value_states], dim=-2)
            self.dense_k, self.dense_v = key_states, value_states
            work = _Prefill(self, key_states, value_states, t)
        else:
            self.dense_k = self.dense_v = None
            work = _Decode(self, key_states, value_states, pos)
        self.inflight += t
        self.is_initialized = True
        _attention.set_pending(work)
        return key_states, value_states


def _valid_keys(mask, b: int, t: int):
    """Which of the last t key positions row b attends (False: padding), or None for all."""
    if mask is None:
        return None
    m = mask[b if mask.shape[0] > 1 else 0, 0, -1, -t:]
    if m.dtype != torch.bool:
        m = m == 0  # additive float mask: 0 where attended
    return m


class _Prefill:
    """A multi-token chunk at the start of a sequence: dense attention over the given
    K/V (transformers' sdpa), then the chunk's K/V appended to the sessions."""

    def __init__(self, layer, keys, values, t):
        self.layer, self.keys, self.values, self.t = layer, keys, values, t

    def run(self, module, query, key, value, mask, kwargs, sdpa):
        out = sdpa(module, query, key, value, mask, **kwargs)
        c, t = self.layer.cache, self.t
        k_new, v_new = key[:, :, -t:, :], value[:, :, -t:, :]
        for b in range(c.batch_size):
            c._append(self.layer, b, k_new[b], v_new[b], _valid_keys(mask, b, t))
        c._observe_prefill(self.layer, query, mask, kwargs)
        self.layer.inflight -= t
        self.layer.stepping = c._stepping
        c._progress_step(self.layer, t)
        return out


class _Decode:
    """New tokens of a sequence already in the sessions: each token's K/V appended,
    then its query answered by libssa decode with the cache's parameters."""

    def __init__(self, layer, keys, values, pos):
        self.layer, self.keys, self.values, self.pos = layer, keys, values, pos

    def run(self, module, query, key, value, mask, kwargs, sdpa):
        c = self.layer.cache
        if kwargs.get("softcap") is not None:
            raise invalid("SSACache layer %d: attention soft-capping is not supported" % self.layer.layer_idx)
        b_, hq, t, d = query.shape
        if hq != c.shape.n_q_heads or d != c.shape.head_dim or b_ != c.batch_size:
            raise invalid("SSACache layer %d: query has shape %s, expected [%d, %d, n_tokens, %d]"
                          % (self.layer.layer_idx, tuple(query.shape), c.batch_size, c.shape.n_q_heads,
                             c.shape.head_dim))
        fix = _model_scale_fix(c, kwargs, d)
        if self.pos > 0 and c._chunk_steps(mask, t):
            return self._run_steps(c, query, fix, t)
        outs = []
        for i in range(t):
            for b in range(b_):
                # One new token is always stored (reading the mask would wait for the
                # device); padding inside a multi-token chunk is skipped.
                valid = _valid_keys(mask, b, t) if t > 1 else None
                c._append(self.layer, b, self.keys[b, :, i:i + 1, :], self.values[b, :, i:i + 1, :],
                          None if valid is None else valid[i:i + 1])
            self.layer.inflight -= 1
            q = query[:, :, i, :]
            if fix != 1.0:
                q = q * fix
            outs.append(c._decode(self.layer, q, self.pos + i).to(device=query.device, dtype=query.dtype))
        self.layer.stepping = c._stepping
        return torch.stack(outs, dim=1), None  # [batch, n_tokens, n_q_heads, head_dim]

    def _run_steps(self, c, query, fix, t):
        """The chunk as t decode steps (CUDA): each token's append and decode in one
        native call, inside a reservation that holds the whole chunk for every layer
        (made at the first layer), so a tiered session moves no page per token."""
        layer = self.layer
        if layer.slot == 0:
            c._reserve_chunk(t)
        dt = getattr(torch, c.dtype)
        outs = []
        for i in range(t):
            q = query[:, :, i, :]
            if fix != 1.0:
                q = q * fix
            k = self.keys[:, :, i, :].to(dt).contiguous()
            v = self.values[:, :, i, :].to(dt).contiguous()
            out = c._run_step(c._epoch, layer.layer_idx, q.to(dt).contiguous(), k, v, counted=True)
            outs.append(out.to(device=query.device, dtype=query.dtype))
            layer.inflight -= 1
        layer.stepping = c._stepping
        return torch.stack(outs, dim=1), None


def _several_devices(rt) -> bool:
    """Whether rt is a CUDA runtime sharding its sessions over several devices
    (read on every eager decode: no copy, no native call)."""
    return rt is not None and rt.backend == "cuda" and len(rt._options["devices"] or ()) > 1


def _model_scale_fix(c, kwargs, d: int) -> float:
    """libssa scales scores by 1/sqrt(head_dim); the factor that puts another model
    scale into q."""
    scaling = kwargs.get("scaling")
    return 1.0 if scaling is None else float(scaling) * math.sqrt(d)


def attend_step(layer: "SSALayer", query, key, value, kwargs):
    """The attention of one decode step (update handed the token over): the new
    token's K/V appended and its query decoded by libssa, in one native call per
    layer (torch.ops.ssa.decode_step when compiling, so that it enters the graph)."""
    c = layer.cache
    if kwargs.get("softcap") is not None:
        raise invalid("SSACache layer %d: attention soft-capping is not supported" % layer.layer_idx)
    b_, hq, t, d = query.shape
    if t != 1 or hq != c.shape.n_q_heads or d != c.shape.head_dim or b_ != c.batch_size:
        raise invalid("SSACache layer %d: query has shape %s, expected [%d, %d, 1, %d]"
                      % (layer.layer_idx, tuple(query.shape), c.batch_size, c.shape.n_q_heads, c.shape.head_dim))
    fix = _model_scale_fix(c, kwargs, d)
    q = query[:, :, 0, :]
    if fix != 1.0:
        q = q * fix
    dt = getattr(torch, c.dtype)
    q = q.to(dt).contiguous()
    k = key[:, :, 0, :].to(dt).contiguous()
    v = value[:, :, 0, :].to(dt).contiguous()
    if torch.compiler.is_compiling():
        out = torch.ops.ssa.decode_step(c._token, q, k, v, layer.layer_idx)
    else:
        out = c._run_step(c._epoch, layer.layer_idx, q, k, v)
    return out.to(device=query.device, dtype=query.dtype).unsqueeze(1), None  # [batch, 1, n_q_heads, head_dim]


class SSACache(Cache):
    """A transformers Cache keeping the K/V of the model's full-attention layers in
    libssa sessions (one per batch row, keys after RoPE) and answering each decode
    step's queries with libssa's sparse decode; sliding-window layers stay on
    transformers' own sliding cache.

    Args:
        model: the model (loaded with attn_implementation="ssa").
        method: "dense", "oracle_topk", "pq_topk", "hybrid_uniform", "sampling",
            "ssa" or "ssa_adaptive".
        sparsity: N / budget when budget is None (>= 1).
        budget: rows read per query head per decode, sink and local included.
        h: heavy fraction of SSA and HYBRID_UNIFORM, in [0, 1].
        n_sink, n_local: tokens always read at the start and the end.
        seed: sampling seed; the RNG step of a decode is its token's position, so
            a sequence's samples do not depend on the batch or on save/load.
        backend: "auto" (the device of the model's tensors), "cpu" or "cuda".
        observer: observer(layer_idx, query, output, stats, cache), called after each
            libssa decode; query and output are [batch, n_q_heads, head_dim] tensors
            (the query as libssa got it), stats a list of ssa.DecodeStats per batch row.
            Without an observer, stats (cache.last_stats) are collected for one
            sequence on the CPU only; batches then go through one ssa_decode_batch
            call per layer and CUDA decodes never wait for the device.
        threads: CPU worker threads of the libssa runtime (0: all cores).
        progress_min_tokens: prefills of at least this many tokens show a progress
            bar over the layers (None: never).
        group_selection: "off" (each query head selects its own rows), "mixture" or
            "mean_query" (one selection per KV head shared by its query heads;
            docs/GROUP_SELECTION.md).
        traces: record the rows every query head read at every libssa decode
            (ssa_decode_traced; CPU sessions only): cache.last_traces[layer_idx] is
            then a list of ssa.DecodeTrace per batch row, replaced at each decode of
            that layer (an observer sees the current step's).
        runtime: an ssa.Runtime to make the sessions on, shared with other caches
            (its device budget, host cache, shards, threads and seed apply); None:
            a runtime of the cache's own with default options, on the device of the
            model's tensors. A runtime whose backend or device does not fit the
            cache or the model is refused, naming the option.
        page_tokens: tokens per K/V page of the sessions (a power of two, 16..4096;
            None: the library's 256). A checkpoint writes the rows a turn added
            (not the partial pages they fall in again).
        process_group: this process is one rank of a group of processes sharing the
            cache's sessions (docs/DISTRIBUTED.md; CPU only): a torch.distributed process
            group, or True for the default group. Every rank runs the same model on the
            same inputs (the same torch thread count, so that its q is bitwise the
            others'); each decode reads the rank's shard and every rank gets the output.
            Not with traces, save or load in this version.
        shard_tokens: with process_group, the tokens each rank's shard takes before the
            next rank's starts (0: 1048576; else a multiple of 8192).
        reserve_tokens: CUDA sessions: the tokens reserved ahead for decode steps
            (ssa_session_reserve; renewed when used up). A step runs on the device
            from device lengths, so a CUDA graph captures it once and replays it.
            None: 1024, or 128 on a tiered runtime (device_kv_budget), whose pages
            move between tiers and whose cache of host pages learns at each renewal.
        proxy: the sessions' proxy (see Runtime.create_session). None: "qpq", the
            query-aware proxy (PQ's 16 bytes per token per KV head; the best recall
            of the exact top keys measured, docs/FIDELITY.md), or "pq" on a CUDA
            runtime of several devices or processes (sharded sessions take PQ only). A process
            group's ranks are shown the same queries, so their index is the one a
            single process trains. The 4-bit ones ("pq4", "opq4", "qpq4") take 32
            subspaces of 16 centroids, PQ's bytes. The query-aware ones ("qpq", "qpq4") are shown
            each prefill's last 256 queries of every layer (Session.observe_queries),
            which the layer's index then learns from at its first decode; a cache
            filled without a prefill (append_kv) trains as PQ after a rotation.

    Decode steps (one new token per row after the prompt) are one native call per
    layer, ssa_decode_step: the token's K/V appended and its query decoded. The cache
    is compileable (transformers' generate then compiles the decode forward with CUDA
    graphs, as for its StaticCache) when every layer is a full-attention layer and
    there is no observer, no traces and no process group; the step enters the graph
    as the custom op torch.ops.ssa.decode_step. Compiled and eager steps run the same
    kernels and give the same tokens. The PQ index of a layer is trained at its first
    decode that needs it (or its first reservation), not during the prefill, so the
    prefill takes no longer than the model's own.

    Prefill (a multi-token chunk at the start of a sequence) attends densely with
    transformers' sdpa and appends the chunk's K/V; a later multi-token chunk (after a
    decode, a load or a truncate) goes token by token through libssa decode. Padding
    positions (attention_mask 0) are not stored.
    """

    def __init__(self, model, method: str = "ssa", sparsity: float = 20.0, budget: Optional[int] = None,
                 h: float = 0.4, n_sink: int = 128, n_local: int = 128, seed: int = 0, backend: str = "auto",
                 observer: Optional[Callable] = None, threads: int = 0,
                 progress_min_tokens: Optional[int] = 8192, group_selection: str = "off",
                 traces: bool = False, runtime: Optional[_core.Runtime] = None,
                 page_tokens: Optional[int] = None, process_group: Any = None, shard_tokens: int = 0,
                 reserve_tokens: Optional[int] = None, proxy: Optional[str] = None):
        self.shape = _model.shape_of(model)
        impl = getattr(_model.text_config(model), "_attn_implementation", None)
        if impl is not None and impl != "ssa":
            raise invalid("the model runs attention %r; an SSACache needs a model loaded with "
                          "attn_implementation=\"ssa\" (after import ssa.hf)" % (impl,))
        self.params = _params.check(dict(method=method, sparsity=sparsity, budget=budget, h=h, n_sink=n_sink,
                                         n_local=n_local, seed=seed, group_selection=group_selection))
        self.backend = _params.check_backend(backend)
        if observer is not None and not callable(observer):
            raise invalid("observer must be callable, got %r" % (observer,))
        self.observer = observer
        self.threads = threads
        self._given_runtime = _runtime.check_given(runtime, self.backend, threads)
        self._storage = _runtime.check_storage(page_tokens)
        self._storage.update(_runtime.check_proxy(proxy))
        if process_group is not None and self.backend == "cuda":
            raise invalid("SSACache(process_group=...) runs on the CPU backend only in this version")
        self.process_group = process_group
        self.shard_tokens = shard_tokens
        if process_group is not None and runtime is not None:
            raise invalid("SSACache: pass runtime= or process_group= (a runtime built for the group), not both")
        self.progress_min_tokens = progress_min_tokens
        if reserve_tokens is not None and (isinstance(reserve_tokens, bool) or not isinstance(reserve_tokens, int)
                                           or reserve_tokens < 1):
            raise invalid("reserve_tokens must be None or an integer >= 1, got %r" % (reserve_tokens,))
        self.reserve_tokens = reserve_tokens
        self.fingerprint = _model.fingerprint(model)
        self._model_device = next((p.device.type for p in model.parameters()), "cpu")
        self._config_summary = _model.config_summary(model)
        slots = {}
        layers: List[Any] = []
        for i, t in enumerate(self.shape.layer_types):
            if t == _model.FULL:
                slots[i] = len(slots)
                layers.append(SSALayer(self, i, slots[i]))
            else:
                layers.append(DynamicSlidingWindowLayer(sliding_window=self.shape.sliding_window))
        super().__init__(layers=layers)
        self._slots = slots
        self.sessions: List[_core.Session] = []
        self.runtime: Optional[_core.Runtime] = None
        self.dtype: Optional[str] = None
        self.device: Optional[torch.device] = None
        self.last_stats: Dict[int, list] = {}
        self.traces = bool(traces)
        self.last_traces: Dict[int, list] = {}
        self._padded = False
        self._bar = None
        self._step = 0  # RNG step of the last decode
        # Decode steps: the reservation in force (CUDA) and the token naming it in
        # compiled steps (_steps.py); the epoch counts reservations.
        self._reserved = False
        self._left = 0
        self._epoch = 0
        # Seconds spent in ssa_session_reserve (on a tiered runtime: the session's
        # pages brought to the device, idle sessions' sent to the host), for benchmarks.
        self.reserve_seconds = 0.0
        self._token: Optional[torch.Tensor] = None

    # -- decode steps
    @property
    def _stepping(self) -> bool:
        """Whether single-token decodes go through ssa_decode_step (not with traces,
        which record per-row decodes, nor across a process group, nor on a CUDA
        runtime whose sessions take no reservation: sharded ones)."""
        return not self.traces and self.process_group is None and self._runtime_steps()

    def _runtime_steps(self) -> bool:
        """Whether the runtime's sessions take decode steps: CPU ones (eagerly) and
        CUDA ones on one device, tiered or not (ssa_session_reserve refuses sharded
        sessions: their pages live on several devices)."""
        return not _several_devices(self._any_runtime())

    def _any_runtime(self):
        return self.runtime if self.runtime is not None else self._given_runtime

    def _reserve_n(self) -> int:
        """Tokens per reservation (reserve_tokens; its default by runtime)."""
        if self.reserve_tokens is not None:
            return self.reserve_tokens
        rt = self._any_runtime()
        return 128 if rt is not None and rt._options["device_kv_budget"] else 1024

    @property
    def is_compileable(self) -> bool:
        """Whether a compiled forward (torch.compile, CUDA graphs) can run this cache's
        decode steps: every layer full-attention, no observer, no traces, no process
        group, a runtime whose sessions take steps (on CUDA: one device, tiered or not),
        and a group selection the device step supports."""
        if not self._stepping or self.observer is not None or len(self._slots) != self.shape.n_layers:
            return False
        if self._model_device != "cpu" and self._host_sessions():
            return False  # each step would copy q, k and v to the host: no graph can hold that
        return self._device_step_fits()

    def _host_sessions(self) -> bool:
        if self.runtime is not None:
            return self.runtime.backend == "cpu"
        if self._given_runtime is not None:
            return self._given_runtime.backend == "cpu"
        return self.backend == "cpu"

    def _device_step_fits(self) -> bool:
        """Whether ssa_decode_step makes this cache's selection on the device (not the
        mixture of several query heads per KV head)."""
        gqa = self.shape.n_q_heads // self.shape.n_kv_heads
        return not (self.params.get("group_selection") == "mixture" and gqa > 1)

    def _length0(self, slot: int) -> int:
        """Tokens row 0 stores at session layer slot, counting steps still queued."""
        if self._reserved:
            self._settle()
        return self.sessions[0].layer_length(slot)

    def _settle(self) -> None:
        """Commits the steps queued on the device; a step that did nothing (replayed
        past or outside its reservation) is an error: its token's output was never
        written."""
        dropped = sum(s.sync() for s in self.sessions)
        if dropped:
            self._end_reservation()
            raise RuntimeError("SSACache: %d decode step(s) did nothing: a CUDA graph was replayed outside the "
                        "reservation it was captured under (the output of those tokens is wrong); generate "
                        "renews reservations before each step, a loop of its own calls "
                        "cache.prepare_step() before each forward" % dropped)

    def prepare_step(self) -> None:
        """Readies the next decode step (generate calls it through the mask sizes):
        commits the steps queued so far and, on CUDA, renews the sessions' reservation
        when it is used up. A loop that runs a compiled forward of its own, without
        generate, calls it before each forward."""
        self._before_step()

    def prefetch_turn(self) -> None:
        """Starts this cache's next turn ahead, on a runtime with a device budget whose
        caches take turns (ssa_session_prefetch): its sessions' host pages cross to the
        device while another cache generates, and its next decode step's reservation
        takes them in instead of waiting for the copies. Call it for the next cache
        once the current one holds its reservation (after its prepare_step()):
        idle caches, the current one before it reserves too, give up device pages to it.
        Nothing to do on other runtimes or before the cache holds tokens."""
        if not self.sessions or self.runtime.backend != "cuda" or not self._stepping:
            return
        for s in self.sessions:
            s.prefetch(self._reserve_n())

    def _before_step(self, need: int = 1) -> None:
        """Commits the queued steps and renews the reservation unless `need` more
        tokens fit in it (CUDA)."""
        self._drop_prefill_kv()
        if not self.sessions or self.runtime.backend != "cuda":
            return
        if self._reserved:
            self._settle()
            self._left = self._cap0 - self.sessions[0].layer_length(0)
        self._ensure_reserved(need)

    def _chunk_steps(self, mask, t: int) -> bool:
        """Whether a chunk of a sequence already in the sessions goes through decode
        steps: CUDA sessions that take them, no traces, and no padding inside the chunk
        (steps store every token). A first prompt never does: a reservation needs the
        prompt appended (a one-token prompt comes here with nothing stored)."""
        if not self.sessions or self.runtime.backend != "cuda" or not self._stepping:
            return False
        if not self._device_step_fits():
            return False
        for b in range(len(self.sessions)):
            valid = _valid_keys(mask, b, t)
            if valid is not None and not bool(valid.all()):
                return False
        return True

    def _reserve_chunk(self, t: int) -> None:
        """Before the first layer's steps of a t-token chunk: a reservation with room
        for all t tokens on every layer (each layer takes the chunk's tokens after the
        one before it has taken all of them), which the chunk then uses up."""
        self._before_step(t)
        self._left -= t

    def _ensure_reserved(self, need: int = 1) -> None:
        if self._reserved and self._left >= need:
            return
        n = max(self._reserve_n(), need)
        t0 = time.perf_counter()
        try:
            for s in self.sessions:
                s.reserve(n)
        except Error as e:
            self._end_reservation()
            raise _relabel(e, "SSACache: reserving %d tokens for decode steps" % n) from None
        finally:
            self.reserve_seconds += time.perf_counter() - t0
        self._reserved = True
        self._left = n
        self._cap0 = self.sessions[0].layer_length(0) + n
        self._new_token()

    def _step_params(self, stream):
        """The ssa_decode_params of a step (RNG step 0: the library adds the token's
        position), made once per parameters and stream."""
        key = (stream.cuda_stream if stream is not None else 0)
        cached = getattr(self, "_step_params_cache", None)
        if cached is None or cached[0] is not self.params or cached[1] != key:
            p = _core._decode_params(**_params.library_kwargs(self.params), step=0, stream=stream)
            cached = (self.params, key, p)
            self._step_params_cache = cached
        return cached[2]

    def _drop_prefill_kv(self, layer: Optional[SSALayer] = None) -> None:
        """A decode step ends the prefill: the prompt's K/V tensors kept for a chunked
        prefill's attention are dropped (the sessions hold them)."""
        for x in [layer] if layer is not None else self.layers:
            if isinstance(x, SSALayer):
                x.dense_k = x.dense_v = None

    def _end_reservation(self) -> None:
        """The sessions' reservation has ended (an append, truncate, fork, save...):
        a compiled step recorded under it must not be replayed, so its token goes."""
        if self._reserved:
            self._reserved = False
            self._new_token()

    def _new_token(self) -> None:
        if self._token is not None:
            _steps.forget_token(self._token)
        self._epoch += 1
        self._token = _steps.new_token(self, self.device, self._epoch)

    def _run_step(self, epoch: int, layer_idx: int, q, k, v, counted: bool = False):
        """The decode step of every row at one layer (the body of ssa::decode_step):
        q [batch, n_q_heads, head_dim], k/v [batch, n_kv_heads, head_dim]. counted:
        the reservation already holds this token (a chunk's steps, _reserve_chunk)."""
        slot = self._slots[layer_idx]
        layer = self.layers[layer_idx]
        if layer.dense_k is not None:
            self._drop_prefill_kv(layer)
        cuda = self.runtime.backend == "cuda"
        if cuda and not self._device_step_fits():
            # A selection the device step does not make: the append and the decode
            # as two calls (eager only; such a cache is not compileable).
            for b in range(len(self.sessions)):
                self._append(layer, b, k[b].unsqueeze(1), v[b].unsqueeze(1), None)
            return self._decode(layer, q, layer.seen - 1)
        stream = self._stream() if cuda else None
        if cuda:
            if not counted and not torch.cuda.is_current_stream_capturing():
                # Run eagerly (no graph, or a graph's warm-up): the host keeps count.
                if slot == 0 and self._reserved and self._left <= 0:
                    self._settle()
                    self._left = self._cap0 - self.sessions[0].layer_length(0)
                self._ensure_reserved()
                if slot == 0:
                    self._left -= 1  # the step takes a token of every layer's reservation
        else:
            q, k, v = self._to_session(q), self._to_session(k), self._to_session(v)
        out = torch.empty_like(q)
        want_stats = self.observer is not None or (not cuda and len(self.sessions) == 1)
        stats: List[Any] = [None] * len(self.sessions)
        # q, k, v and out are contiguous [batch, heads, head_dim] tensors of the
        # sessions' dtype and memory space (attend_step made them so): their rows go to
        # the library by address, with one parameter struct per parameters and stream.
        params = self._step_params(stream)
        kb, qb = k.stride(0) * k.element_size(), q.stride(0) * q.element_size()
        try:
            if want_stats:
                for b, s in enumerate(self.sessions):
                    st = _core.ffi.new("ssa_decode_stats *")
                    _core.lib.ssa_decode_stats_init(st)
                    s._step_pointers(slot, k.data_ptr() + b * kb, v.data_ptr() + b * kb, q.data_ptr() + b * qb,
                                     out.data_ptr() + b * qb, params, st)
                    stats[b] = _core.DecodeStats._from_c(st)
            elif len(self.sessions) == 1:
                self.sessions[0]._step_pointers(slot, k.data_ptr(), v.data_ptr(), q.data_ptr(), out.data_ptr(),
                                                params, _core.ffi.NULL)
            else:
                self.runtime._step_batch_pointers(self.sessions, k.data_ptr(), v.data_ptr(), q.data_ptr(),
                                                  out.data_ptr(), kb, qb, slot, params)
        except Error as e:
            raise _relabel(e, "SSACache layer %d (session layer %d), decode step of a query of shape %s"
                           % (layer_idx, slot, tuple(q.shape))) from None
        self._last_was_step = True
        if slot == 0:
            self.last_stats = {}
        self.last_stats[layer_idx] = stats
        if self.observer is not None:
            self.observer(layer_idx, q, out, stats, self)
        return out

    # -- what it holds
    @property
    def batch_size(self) -> int:
        return len(self.sessions) if self.sessions else -1

    def layer_of(self, model_layer_idx: int) -> Optional[int]:
        """The session layer holding model layer model_layer_idx; None for sliding layers."""
        if not 0 <= int(model_layer_idx) < self.shape.n_layers:
            raise invalid("layer %r is not a layer of this %d-layer model" % (model_layer_idx, self.shape.n_layers))
        return self._slots.get(int(model_layer_idx))

    def __len__(self):
        return self.shape.n_layers

    def __repr__(self):
        n_full = len(self._slots)
        p = self.params
        budget = "budget=%d" % p["budget"] if p["budget"] else "sparsity=%g" % p["sparsity"]
        where = ("%s %s" % (self.runtime.backend, self.dtype)) if self.runtime is not None else "no session yet"
        rows = ", ".join(str(len(s)) for s in self.sessions[:4]) + (", ..." if len(self.sessions) > 4 else "")
        return ("SSACache(%s: %d layers, %d in libssa (%s), %d sliding-window on transformers' cache; "
                "%d sequence(s) of %d position(s), tokens stored per row [%s]; method=%s %s h=%g "
                "sink=%d local=%d seed=%d)" % (self.shape.model_type, self.shape.n_layers, n_full, where,
                                               self.shape.n_layers - n_full, max(self.batch_size, 0),
                                               self.get_seq_length(), rows, p["method"], budget, p["h"],
                                               p["n_sink"], p["n_local"], p["seed"]))

    def set_params(self, **params) -> None:
        """Changes decode parameters (method, sparsity, budget, h, n_sink, n_local, seed)
        for the following steps; all are checked before any is changed."""
        self.params = _params.check(params, self.params)
        if self.sessions:
            self._new_token()  # a compiled step recorded with the old parameters is not replayed

    def append_kv(self, layer_idx: int, key_states, value_states) -> None:
        """Appends K/V rows to model layer layer_idx as a prefill leaves them, without
        attending: key_states and value_states [batch, n_kv_heads, n_tokens, head_dim]
        (K/V computed elsewhere, say by another engine's prefill). Every layer must be
        given the same number of tokens before the next forward. Sliding-window layers
        are refused (they are transformers' own cache)."""
        slot = self.layer_of(layer_idx)
        if slot is None:
            raise invalid("SSACache.append_kv: layer %d is a sliding-window layer (transformers' own cache)"
                          % layer_idx)
        layer = self.layers[layer_idx]
        if layer.inflight:
            raise invalid("SSACache.append_kv: layer %d has K/V of a forward not attended yet" % layer_idx)
        layer._check_kv(key_states, value_states)
        layer.dense_k = layer.dense_v = None  # the prefill's dense pass, if any, ends here
        for b in range(self.batch_size):
            self._append(layer, b, key_states[b], value_states[b], None)
        layer.is_initialized = True
        layer.stepping = self._stepping  # the next single token is a decode step, as after a prefill

    # -- Cache protocol
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if layer_idx >= len(self.layers):
            return 0
        return self.layers[layer_idx].get_seq_length()

    def reset(self) -> None:
        self._reset()

    def crop(self, max_length: int) -> None:
        n = self.get_seq_length() + max_length if max_length < 0 else max_length
        self.truncate(max(n, 0))

    def reorder_cache(self, beam_idx) -> None:
        self._select_rows([int(i) for i in beam_idx.tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select_rows([b for b in range(max(self.batch_size, 0)) for _ in range(repeats)])

    def batch_select_indices(self, indices) -> None:
        idx = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        self._select_rows([int(i) for i in idx])

    # -- sessions
    def _ensure_sessions(self, key_states, layer_idx: int) -> None:
        if self.sessions:
            dev = key_states.device
            want = self.device if self.runtime.backend == "cuda" else torch.device("cpu")
            if self.runtime.backend == "cuda" and dev != want:
                raise invalid("SSACache layer %d: key_states on %s, the cache's sessions on %s"
                              % (layer_idx, dev, want))
            return
        dt = _TORCH_DTYPES.get(key_states.dtype)
        if dt is None:
            raise invalid("SSACache layer %d: key_states dtype %s; libssa takes float32, float16 and bfloat16"
                          % (layer_idx, key_states.dtype))
        dev = key_states.device
        backend = _runtime.backend_for(self, dev, layer_idx)
        self._open(backend, dt, dev, int(key_states.shape[0]))

    def _open(self, backend: str, dtype: str, device, batch: int) -> None:
        if self.process_group is not None:
            if backend != "cpu":
                raise invalid("SSACache(process_group=...) got %s tensors; it runs on the CPU only" % device)
            from .. import distributed

            group = None if self.process_group is True else self.process_group
            self.runtime = distributed.runtime(group, threads=self.threads, shard_tokens=self.shard_tokens)
            self.device = torch.device("cpu")
        else:
            self.runtime, self.device = _runtime.open_runtime(self, backend, device)
        self.dtype = dtype
        self.sessions = [self._new_session() for _ in range(batch)]
        self._new_token()

    def _session_shape(self) -> dict:
        s = self.shape
        return dict(n_layers=len(self._slots), n_q_heads=s.n_q_heads, n_kv_heads=s.n_kv_heads,
                    head_dim=s.head_dim, dtype=self.dtype, model_fingerprint=int(self.fingerprint[:16], 16))

    def _new_session(self) -> _core.Session:
        # No PQ training during appends: a layer's index is trained by its first
        # decode that needs one (or its first reservation), off the prefill's path.
        storage = dict(self._storage)
        if "proxy" not in storage:
            storage["proxy"] = self._default_proxy()
        return self.runtime.create_session(**self._session_shape(), **storage,
                                           index_min_tokens=_TRAIN_AT_FIRST_DECODE)

    def _default_proxy(self) -> str:
        """proxy=None: the query-aware proxy, which ranks best on every model measured at
        PQ's bytes (docs/FIDELITY.md, the default proxy) and learns from the queries each
        prefill shows it; its index trains at the first decode after a prefill, on the
        device on CUDA runtimes. PQ on a CUDA runtime of several devices or processes,
        whose sharded sessions take PQ only."""
        rt = self.runtime  # as CudaBackend::init_session: several devices, or any process group
        if rt is not None and rt.backend == "cuda" and (rt.shards > 1 or rt._collective is not None):
            return "pq"
        return "qpq"

    def _observe_prefill(self, layer: SSALayer, query, mask, kwargs) -> None:
        """Shows a query-aware session the prefill chunk's last queries of each row
        ([batch, n_q_heads, t, head_dim]; padding skipped), as its decodes scale them."""
        if not self.sessions or self.sessions[0].config.proxy not in (_core.Proxy.QPQ, _core.Proxy.QPQ4):
            return
        t, d = query.shape[2], query.shape[3]
        fix = _model_scale_fix(self, kwargs, d)
        for b, s in enumerate(self.sessions):
            q = query[b].transpose(0, 1)  # [t, n_q_heads, d]
            valid = _valid_keys(mask, b, t)
            if valid is not None:
                q = q[valid]
            q = q[-_OBSERVED_PREFILL_QUERIES:]
            if fix != 1.0:
                q = q * fix
            try:
                s.observe_queries(layer.slot, self._to_session(q))
            except Error as e:
                raise _relabel(e, "SSACache layer %d (session layer %d, batch row %d), observing %d queries"
                               % (layer.layer_idx, layer.slot, b, q.shape[0])) from None

    def _to_session(self, x):
        """x as the session takes it: its dtype, its memory space, contiguous."""
        x = x.to(dtype=getattr(torch, self.dtype))
        if self.runtime.backend == "cpu" and x.device.type != "cpu":
            x = x.cpu()  # backend="cpu" with a CUDA model: a copy and a wait
        return x.contiguous()

    def _stream(self):
        return torch.cuda.current_stream(self.device) if self.runtime.backend == "cuda" else None

    def _append(self, layer: SSALayer, b: int, k, v, valid) -> None:
        """Appends row b's [n_kv, t, d] K/V (positions where valid is False skipped)."""
        k, v = k.transpose(0, 1), v.transpose(0, 1)
        if valid is not None and not bool(valid.all()):
            self._padded = True
            k, v = k[valid], v[valid]
            if b == 0:
                layer.pad0 += int(valid.numel()) - int(k.shape[0])
        if k.shape[0] == 0:
            return
        self._end_reservation()  # an append ends a session's reservation
        k, v = self._to_session(k), self._to_session(v)
        s = self.sessions[b]
        try:
            if self.runtime.backend == "cuda":
                # Queued on torch's stream: the tensors' memory is reused only by later
                # work on that stream, which runs after the copy.
                s.append_async(layer.slot, k, v, stream=self._stream())
            else:
                s.append(layer.slot, k, v)
        except Error as e:
            raise _relabel(e, "SSACache layer %d (session layer %d, batch row %d), appending K/V of shape %s"
                           % (layer.layer_idx, layer.slot, b, tuple(k.shape))) from None

    def _decode(self, layer: SSALayer, q, step: int, params: Optional[dict] = None, observe: bool = True):
        """libssa decode of [batch, n_q_heads, head_dim] queries at one layer."""
        q = self._to_session(q)
        out = torch.empty_like(q)
        kw = _params.library_kwargs(params or self.params)
        kw["step"] = step
        cuda = self.runtime.backend == "cuda"
        if cuda:
            kw["stream"] = self._stream()
        # Stats come from per-row decodes: always for one CPU sequence, else only for
        # an observer (ssa_decode_batch returns none; on CUDA they cost a wait).
        want_stats = (observe and self.observer is not None) or (not cuda and len(self.sessions) == 1)
        stats: List[Any] = [None] * len(self.sessions)
        traced = observe and self.traces
        try:
            if traced:
                kw.pop("stream", None)
                rows = [s.decode_traced(layer.slot, q[b], out=out[b], **kw) for b, s in enumerate(self.sessions)]
                stats = [r[1] for r in rows]
                self.last_traces[layer.layer_idx] = [r[2] for r in rows]
            elif len(self.sessions) > 1 and not want_stats:
                self.runtime.decode_batch([(s, q[b], out[b]) for b, s in enumerate(self.sessions)],
                                          layer.slot, **kw)
            else:
                for b, s in enumerate(self.sessions):
                    r = s.decode(layer.slot, q[b], out=out[b], stats=want_stats, **kw)
                    if want_stats:
                        stats[b] = r[1]
        except Error as e:
            raise _relabel(e, "SSACache layer %d (session layer %d), decoding a query of shape %s"
                           % (layer.layer_idx, layer.slot, tuple(q.shape))) from None
        if observe:
            self._step = step
            self._last_was_step = False
            if layer.slot == 0:
                self.last_stats = {}
            self.last_stats[layer.layer_idx] = stats
            if self.observer is not None:
                self.observer(layer.layer_idx, q, out, stats, self)
        return out

    def decode_reference(self, layer_idx: int, query, method: str = "dense", **params):
        """The output of another decode method on the same sessions at model layer
        layer_idx, for error measurement. query: [batch, n_q_heads, head_dim] (or
        [n_q_heads, head_dim] for one sequence), as the observer received it.
        params: as set_params (unset ones are the cache's); the RNG step is that of the
        last decode. Returns a tensor of query's shape."""
        slot = self.layer_of(layer_idx)
        if slot is None:
            raise invalid("model layer %d is a sliding-window layer; it is not in libssa" % layer_idx)
        if not self.sessions:
            raise invalid("the cache holds no tokens yet")
        p = _params.check(dict(params, method=method), self.params)
        one = query.dim() == 2
        q = query.unsqueeze(0) if one else query
        want = (len(self.sessions), self.shape.n_q_heads, self.shape.head_dim)
        if tuple(q.shape) != want:
            raise invalid("decode_reference layer %d: query has shape %s, expected %s"
                          % (layer_idx, tuple(query.shape), want))
        if not getattr(self, "_last_was_step", False):
            out = self._decode(self.layers[layer_idx], q, self._step, p, observe=False)
            return out[0] if one else out
        # After decode steps: each row's RNG step is the position of its last token.
        q = self._to_session(q)
        out = torch.empty_like(q)
        kw = _params.library_kwargs(p)
        if self.runtime.backend == "cuda":
            kw["stream"] = self._stream()
        try:
            for b, s in enumerate(self.sessions):
                s.decode(slot, q[b], out=out[b], step=s.layer_length(slot) - 1, **kw)
        except Error as e:
            raise _relabel(e, "decode_reference layer %d" % layer_idx) from None
        return out[0] if one else out

    # -- progress of long prefills
    def _progress_step(self, layer: SSALayer, t: int) -> None:
        if self.progress_min_tokens is None or t < self.progress_min_tokens:
            return
        if layer.slot == 0:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=len(self._slots), desc="prefill %d tokens" % t, unit="layer", leave=False)
        if self._bar is not None:
            self._bar.update(1)
            if layer.slot == len(self._slots) - 1:
                self._bar.close()
                self._bar = None

    # -- rows, rollback, branches
    def _reset(self) -> None:
        self._end_reservation()
        for s in self.sessions:
            s.close()
        self.sessions = []
        self.last_stats = {}
        self._padded = False
        for layer in self.layers:
            if isinstance(layer, SSALayer):
                layer.seen = 0
                layer.stepping = False
                layer.dense_k = layer.dense_v = None
            else:
                layer.keys = layer.values = None
                layer.is_initialized = False
                layer.cumulative_length = 0

    def _crop_from_layer(self, layer, tokens_to_remove):
        # Cache.crop loops over layers; the sessions are cropped once, by the first.
        if layer.slot == 0:
            self.crop(tokens_to_remove)

    def _select_rows_from_layer(self, layer, rows):
        if layer.slot == 0:
            self._select_rows(rows)

    def _select_rows(self, rows: List[int]) -> None:
        n = len(self.sessions)
        if n == 0:
            return
        for r in rows:
            if not 0 <= r < n:
                raise invalid("batch row %d out of range (the cache holds %d)" % (r, n))
        seen = {layer.slot: layer.seen for layer in self.layers if isinstance(layer, SSALayer)}
        self._end_reservation()  # forking ends the sessions' reservations
        new = [self.sessions[r].fork() for r in rows]
        for s in self.sessions:
            s.close()
        self.sessions = new
        idx = torch.tensor(rows, dtype=torch.long)
        for layer in self.layers:
            if isinstance(layer, SSALayer):
                layer.seen = seen[layer.slot]  # row 0 may be another row now
                if layer.dense_k is not None:
                    layer.dense_k = layer.dense_k[idx.to(layer.dense_k.device)]
                    layer.dense_v = layer.dense_v[idx.to(layer.dense_v.device)]
            elif layer.is_initialized and layer.keys is not None and layer.keys.numel():
                layer.keys = layer.keys[idx.to(layer.keys.device)]
                layer.values = layer.values[idx.to(layer.values.device)]

    def truncate(self, n: int) -> None:
        """Keeps the first n positions (agent rollback); later tokens are forgotten."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise invalid("truncate(n): n must be an integer >= 0, got %r" % (n,))
        cur = self.get_seq_length()
        if n > cur:
            raise invalid("truncate(%d): the cache holds only %d positions" % (n, cur))
        if n == cur:
            return
        if self._padded:
            raise invalid("truncate: this cache stored padded sequences; rollback needs unpadded rows")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, SSALayer) and layer.keys is not None and layer.keys.shape[-2] < cur:
                raise invalid("truncate(%d): model layer %d is a sliding-window layer (window %d) that keeps only "
                              "the last %d of %d positions; it cannot roll back" % (
                                  n, i, layer.sliding_window, layer.keys.shape[-2], cur))
        self._end_reservation()  # truncating ends the sessions' reservations
        for s in self.sessions:
            s.truncate(n)
        for layer in self.layers:
            if isinstance(layer, SSALayer):
                layer.seen = n
                layer.stepping = layer.stepping and n > 0
                if layer.dense_k is not None:
                    layer.dense_k = layer.dense_k[..., :n, :]
                    layer.dense_v = layer.dense_v[..., :n, :]
            elif layer.keys is not None:
                layer.keys = layer.keys[..., :n, :]
                layer.values = layer.values[..., :n, :]
                layer.cumulative_length = n
        self.last_stats = {}

    def fork(self) -> "SSACache":
        """An independent copy (sessions forked copy-on-write, sliding layers copied):
        a branch for an agent, or one of several answers to the same prompt."""
        self._end_reservation()  # forking ends the sessions' reservations
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.sessions = [s.fork() for s in self.sessions]
        new.last_stats = {}
        new.last_traces = {}
        new._bar = None
        new._token = None
        if new.sessions:
            new._new_token()
        layers = []
        for layer in self.layers:
            if isinstance(layer, SSALayer):
                c = SSALayer(new, layer.layer_idx, layer.slot)
                c.pad0, c.inflight, c.stepping = layer.pad0, layer.inflight, layer.stepping
                c.dense_k, c.dense_v, c.is_initialized = layer.dense_k, layer.dense_v, layer.is_initialized
            else:
                c = DynamicSlidingWindowLayer(sliding_window=layer.sliding_window)
                c.__dict__.update({k: v for k, v in layer.__dict__.items()})
                if layer.keys is not None:
                    c.keys, c.values = layer.keys.clone(), layer.values.clone()
            layers.append(c)
        new.layers = layers
        return new

    def save(self, path) -> None:
        """Writes the cache to the folder path (created if missing): one libssa
        snapshot per batch row (a checkpoint, appending only what changed, when path
        holds this cache's earlier save), the sliding-window layers' K/V, and a
        manifest with the model's fingerprint and the decode parameters."""
        from ._persist import save

        save(self, path)

    @classmethod
    def load(cls, path, model, backend: str = "auto", observer: Optional[Callable] = None, threads: int = 0,
             device=None, runtime: Optional[_core.Runtime] = None, process_group: Any = None,
             shard_tokens: int = 0) -> "SSACache":
        """Restores a cache saved with save() for this model. A cache of another model
        (another configuration fingerprint) is refused with ssa.Mismatch.
        backend/device: where the sessions go ("auto": the model's device).
        runtime: an ssa.Runtime to restore the sessions into (as SSACache(runtime=)).
        process_group, shard_tokens: restore into a group of processes (as
        SSACache(process_group=)); a collective call, every rank passes the same path.
        Any save loads into a group of any size, or into one process: each rank keeps
        its shard of the saved rows."""
        from ._persist import load

        return load(cls, path, model, backend, observer, threads, device, runtime,
                    dict(process_group=process_group, shard_tokens=shard_tokens) if process_group is not None else {})
