"""libssa inside Hugging Face transformers.

``import ssa.hf`` registers an attention implementation named ``"ssa"`` (and its mask
function) with transformers. A model loaded with ``attn_implementation="ssa"`` and
given an :class:`SSACache` keeps the K/V of its full-attention layers in libssa
sessions and answers every decode step's queries with libssa's sparse decode::

    import ssa.hf
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="ssa")
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=20)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=32, do_sample=False)

Without an SSACache (or for sliding-window layers) "ssa" is transformers' own sdpa.
"""
from ._attention import register
from ._cache import SSACache
from ._model import ModelShape, fingerprint

register()

__all__ = ["SSACache", "ModelShape", "fingerprint", "register"]
