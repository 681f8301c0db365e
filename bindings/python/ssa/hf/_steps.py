"""The decode step as a torch custom op: how libssa enters a compiled (CUDA-graph) forward.

A generated token's attention at one layer is one native call, ssa_decode_step:
the token's K/V appended and the layer decoded with its query. On CUDA, after
ssa_session_reserve, the step reads the context length from device memory and
advances it there, so a CUDA graph captured once replays it for every later token.

``torch.ops.ssa.decode_step`` is opaque to torch.compile: dynamo and inductor see a
function of (token, q, k, v) returning the attention output, and a CUDA graph
records the kernels its body queues. The op names its cache by a *token*, a small
tensor of the cache's current reservation, marked as a static address: a new cache or
a new reservation is a new address, on which torch's CUDA-graph trees record a new
graph (no recompilation), and a graph recorded for an old reservation is never
replayed for a new one. Token addresses are carved from arenas that are never freed,
so an address never comes back for another reservation.
"""
import threading
import weakref
from typing import Dict, Tuple

import torch

_TOKEN_BYTES = 16  # keeps every token aligned as a fresh allocation is
_ARENA_TOKENS = 1 << 16

_lock = threading.Lock()
_arenas: Dict[Tuple[str, int], list] = {}  # device -> [arena tensor, next free token]
_owners: Dict[int, Tuple["weakref.ref", int]] = {}  # token address -> (cache, its epoch)


def new_token(cache, device: torch.device, epoch: int) -> torch.Tensor:
    """A token never handed out before in this process, owned by cache at epoch."""
    key = (device.type, device.index if device.index is not None else -1)
    with _lock:
        slot = _arenas.get(key)
        if slot is None or slot[1] == _ARENA_TOKENS:
            # The full arena stays referenced (by _arenas' old entry, kept in the list):
            # its addresses must not be reused while graphs recorded on them live.
            arena = torch.zeros(_ARENA_TOKENS * _TOKEN_BYTES, dtype=torch.uint8, device=device)
            slot = [arena, 0, slot]
            _arenas[key] = slot
        i = slot[1]
        slot[1] += 1
        token = slot[0][i * _TOKEN_BYTES:(i + 1) * _TOKEN_BYTES]
        _owners[token.data_ptr()] = (weakref.ref(cache), epoch)
    if device.type == "cuda":
        torch._dynamo.mark_static_address(token, guard=False)
    return token


def forget_token(token: torch.Tensor) -> None:
    with _lock:
        _owners.pop(token.data_ptr(), None)


def owner(token: torch.Tensor):
    """(cache, epoch) the token was handed out to; raises if the cache is gone."""
    entry = _owners.get(token.data_ptr())
    cache = entry[0]() if entry is not None else None
    if cache is None:
        raise RuntimeError("ssa::decode_step: the SSACache this step was compiled or captured for is gone "
                           "(or was reset); a step belongs to the cache that ran it")
    return cache, entry[1]


@torch.library.custom_op("ssa::decode_step", mutates_args=())
def decode_step(token: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer_idx: int) -> torch.Tensor:
    """One generated token at one layer for every batch row: k, v [batch, n_kv_heads,
    head_dim] appended to the row's session, q [batch, n_q_heads, head_dim] decoded
    over the grown context. Returns the attention output, shaped as q."""
    cache, epoch = owner(token)
    return cache._run_step(epoch, layer_idx, q, k, v)


@decode_step.register_fake
def _(token, q, k, v, layer_idx):
    return torch.empty_like(q)
