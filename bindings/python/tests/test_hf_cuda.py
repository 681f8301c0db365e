"""ssa.hf on a CUDA device: a randomly initialised model of Llama-3.1-8B's
attention shape (32 query heads, 8 KV heads, head dim 128; two layers, no weights
needed) decodes with attention "ssa" DENSE from a CUDA session, zero-copy on
torch's stream, and generates what transformers' own "sdpa" generates. Skipped
without torch, transformers or a CUDA device."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

import ssa  # noqa: E402
import ssa.hf  # noqa: E402


def _model(attn, dtype):
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=4096, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=1 << 20, initializer_range=0.02)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).to("cuda", dtype).eval()


def _ids(n, seed):
    return torch.randint(0, 4096, (1, n), generator=torch.Generator().manual_seed(seed)).to("cuda")


def test_dense_generation_on_cuda_equals_sdpa():
    # float32: the two exact attentions agree to rounding far below any logit gap.
    ids = _ids(2048, 1)
    want = _model("sdpa", torch.float32).generate(ids, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    model = _model("ssa", torch.float32)
    cache = ssa.hf.SSACache(model, method="dense")
    got = model.generate(ids, past_key_values=cache, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    assert cache.runtime.backend == "cuda"
    assert torch.equal(got, want)
    # The whole budget through a sparse method is the same exact attention.
    cache = ssa.hf.SSACache(model, method="ssa", budget=1 << 30)
    full = model.generate(ids, past_key_values=cache, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    assert torch.equal(full, want)


def test_dense_decode_on_cuda_bf16_logits_match_sdpa():
    # bf16: two exact attentions round differently, and greedy tokens of a random
    # model (near-ties everywhere) may part after a few steps; one step's logits
    # agree to bf16 rounding.
    ids = _ids(2048, 3)
    sdpa, model = _model("sdpa", torch.bfloat16), _model("ssa", torch.bfloat16)
    with torch.no_grad():
        want = sdpa(ids).logits[0, -1].float()
        cache = ssa.hf.SSACache(model, method="dense")
        model(ids[:, :-1], past_key_values=cache)
        got = model(ids[:, -1:], past_key_values=cache).logits[0, -1].float()
    err = ((got - want).norm() / want.norm()).item()
    print("bf16 decode-step logits: relative difference %.2e, argmax equal %s" % (err, got.argmax() == want.argmax()))
    assert err < 2e-2


def test_sparse_generation_on_cuda_reads_fewer_rows():
    model = _model("ssa", torch.float32)
    ids = _ids(4096, 2)
    seen = []
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=20, n_sink=16, n_local=16,
                            observer=lambda layer, q, out, stats, c: seen.append(stats[0]))
    model.generate(ids, past_key_values=cache, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert seen and all(0 < st.tokens_read <= 32 * ((4100 + 19) // 20) for st in seen)
    # Group selection on CUDA sessions: every head reads the sink and local rows
    # and its group's shared rows, at most the group's G k' (G = 32 / 8 = 4).
    kprime = (4100 + 19) // 20 - 32
    for group in ("mixture", "mean_query"):
        seen.clear()
        cache = ssa.hf.SSACache(model, method="ssa", sparsity=20, n_sink=16, n_local=16, group_selection=group,
                                observer=lambda layer, q, out, stats, c: seen.append(stats[0]))
        model.generate(ids, past_key_values=cache, max_new_tokens=2, do_sample=False, min_new_tokens=2)
        assert seen and all(0 < st.tokens_read <= 32 * (32 + 4 * kprime) for st in seen), group


SHORT_PROMPTS = (1, 2, 17, 255, 256, 300, 1024)
SPARSE_METHODS = ("ssa", "pq_topk", "oracle_topk", "hybrid_uniform", "sampling", "ssa_adaptive")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_short_prompts_generate_on_cuda_with_every_method(dtype):
    """A user's first short prompt: one token to past the window, every method, at
    sparsity 50 (budget below sink + local: window-only heads, no index needed).
    Once crashed the process with an illegal memory access."""
    model = _model("ssa", dtype)
    for n in SHORT_PROMPTS:
        ids = _ids(n, 10 + n)
        runs = {}
        for method in ("dense",) + SPARSE_METHODS:
            cache = ssa.hf.SSACache(model, method=method, sparsity=50)
            out = model.generate(ids, past_key_values=cache, max_new_tokens=6, min_new_tokens=6, do_sample=False)
            torch.cuda.synchronize()
            assert cache.runtime.backend == "cuda"
            assert [len(s) for s in cache.sessions] == [n + 5]
            runs[method] = out[0, n:].tolist()
        # Every sparse method reads the same window (or everything, below it).
        assert all(runs[m] == runs["ssa"] for m in SPARSE_METHODS), (n, runs)
        if n + 5 <= 256:
            assert runs["ssa"] == runs["dense"], n


def test_batch_of_short_and_long_padded_prompts_on_cuda():
    # float32: a batch's other layers round as the single row's, far below logit gaps.
    model = _model("ssa", torch.float32)
    long_, short = _ids(1024, 31)[0], _ids(17, 32)[0]
    pad = long_.shape[0] - short.shape[0]
    ids = torch.stack([long_, torch.cat([torch.zeros(pad, dtype=torch.long, device="cuda"), short])])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    for method in ("dense",) + SPARSE_METHODS:
        cache = ssa.hf.SSACache(model, method=method, sparsity=50)
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=5, min_new_tokens=5,
                             do_sample=False, pad_token_id=0)
        assert [len(s) for s in cache.sessions] == [1024 + 4, 17 + 4]
        for row, seq in ((0, long_), (1, short)):
            alone = ssa.hf.SSACache(model, method=method, sparsity=50)
            ref = model.generate(seq[None], past_key_values=alone, max_new_tokens=5, min_new_tokens=5,
                                 do_sample=False)
            assert out[row, -5:].tolist() == ref[0, -5:].tolist(), (method, row)
