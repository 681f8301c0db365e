"""The "ssa" attention implementation and its registration with transformers.

SSACache.update() hands the layer's work to the attention call that follows it in
the same thread (every transformers attention module calls the cache's update and
then the attention function, back to back); without such a hand-over (another
cache, no cache, sliding layers) "ssa" is transformers' sdpa.
"""
import threading

import torch

_tls = threading.local()
# The hand-over of a decode step inside a compiled forward: dynamo traces a module
# global (the thread-local above is for eager forwards, which may run in many threads).
_compiled_step = None


def set_pending(work) -> None:
    prev = getattr(_tls, "pending", None)
    # A hand-over left by an earlier layer of this forward was never taken: that
    # layer's attention ran another implementation. One from this layer or a later
    # one is what a forward that failed midway left behind: replaced.
    if prev is not None and prev.layer.cache is work.layer.cache and prev.layer.layer_idx < work.layer.layer_idx:
        _tls.pending = None
        raise RuntimeError(
            "SSACache layer %d: the attention call after the cache update did not run through the \"ssa\" "
            "attention implementation; load the model with attn_implementation=\"ssa\" (and import ssa.hf)"
            % prev.layer.layer_idx)
    _tls.pending = work


def take_pending(layer_idx):
    work = getattr(_tls, "pending", None)
    if work is None or work.layer.layer_idx != layer_idx:
        return None
    _tls.pending = None
    return work


def clear_pending() -> None:
    _tls.pending = None


class _Step:
    """A decode step handed over by SSALayer.update (see attend_step)."""

    def __init__(self, layer):
        self.layer = layer

    def run(self, module, query, key, value, mask, kwargs, sdpa):
        return self.layer.attend_step(query, key, value, kwargs)


def set_pending_step(layer) -> None:
    global _compiled_step
    if torch.compiler.is_compiling():
        _compiled_step = layer
    else:
        set_pending(_Step(layer))


def ssa_attention_forward(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    global _compiled_step
    if torch.compiler.is_compiling():
        layer = _compiled_step
        if layer is not None and layer.layer_idx == getattr(module, "layer_idx", None):
            _compiled_step = None
            return layer.attend_step(query, key, value, kwargs)
    work = take_pending(getattr(module, "layer_idx", None))
    if work is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return work.run(module, query, key, value, attention_mask, kwargs, sdpa_attention_forward)


def register() -> None:
    """Registers "ssa" with transformers' AttentionInterface and AttentionMaskInterface."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("ssa", ssa_attention_forward)
    AttentionMaskInterface.register("ssa", sdpa_mask)
