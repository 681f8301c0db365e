"""What SSACache needs to know about a transformers model: its attention shape,
which layers are full attention, and a fingerprint of its configuration."""
import hashlib
import json
from dataclasses import dataclass
from typing import List, Optional

FULL = "full_attention"
SLIDING = ("sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    layer_types: List[str]
    sliding_window: Optional[int]

    @property
    def full_layers(self) -> List[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]


def text_config(model_or_config):
    cfg = getattr(model_or_config, "config", model_or_config)
    get = getattr(cfg, "get_text_config", None)
    return get() if get is not None else cfg


def shape_of(model_or_config) -> ModelShape:
    cfg = text_config(model_or_config)
    n_layers = int(cfg.num_hidden_layers)
    n_q = int(cfg.num_attention_heads)
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_q)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is None:
        types = ["sliding_attention" if window else FULL] * n_layers
    types = list(types)
    if len(types) != n_layers:
        raise ValueError("config.layer_types has %d entries for %d layers" % (len(types), n_layers))
    for i, t in enumerate(types):
        if t != FULL and t not in SLIDING:
            raise ValueError("SSACache supports full and sliding-window attention layers; layer %d is %r" % (i, t))
        if t in SLIDING and not window:
            raise ValueError("layer %d is %r but config.sliding_window is %r" % (i, t, window))
    if getattr(cfg, "attn_logit_softcapping", None):
        raise ValueError("attention logit soft-capping (config.attn_logit_softcapping=%r) is not a softmax "
                         "libssa can compute" % cfg.attn_logit_softcapping)
    return ModelShape(str(getattr(cfg, "model_type", "?")), n_layers, n_q, n_kv, int(head_dim), types,
                      int(window) if window else None)


# Configuration fields that decide what the K/V of a layer are; two models that
# differ in any of them cannot share a cache.
_FIELDS = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
           "hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta",
           "rope_scaling", "rope_parameters", "rms_norm_eps", "layer_types", "sliding_window",
           "query_pre_attn_scalar", "tie_word_embeddings", "hidden_act", "attention_bias")


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in sorted(x.items())}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def config_summary(model_or_config) -> dict:
    cfg = text_config(model_or_config)
    return {f: _plain(getattr(cfg, f, None)) for f in _FIELDS if getattr(cfg, f, None) is not None}


def fingerprint(model_or_config) -> str:
    """A hex SHA-256 of the configuration fields that shape a layer's K/V."""
    blob = json.dumps(config_summary(model_or_config), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()
