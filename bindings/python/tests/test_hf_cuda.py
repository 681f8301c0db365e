"""ssa.hf on a CUDA device: a randomly initialised model of Llama-3.1-8B's
attention shape (32 query heads, 8 KV heads, head dim 128; two layers, no weights
needed) decodes with attention "ssa" DENSE from a CUDA session, zero-copy on
torch's stream, and generates what transformers' own "sdpa" generates. Skipped
without torch, transformers or a CUDA device."""
import json
import os
import subprocess
import sys

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
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).to("cuda", dtype).eval()
    # generate compiles a compileable cache's decode forward (CUDA graphs); the tests
    # below run the eager path unless they say otherwise (test_compiled_*).
    model.generation_config.disable_compile = True
    return model


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


def _generate(model, cache, ids, n, compiled, mask=None):
    return model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, disable_compile=not compiled)


@pytest.mark.parametrize("method", ["ssa", "pq_topk", "dense"])
def test_compiled_generate_on_cuda_equals_eager(method):
    # generate's own compiled path (torch.compile, mode "reduce-overhead": CUDA
    # graphs recorded once and replayed). Eight tokens reserved at a time, so that
    # 31 steps renew the reservation (and record new graphs) several times.
    model = _model("ssa", torch.float32)
    ids = _ids(1500, 41)
    kw = dict(method=method, budget=200, n_sink=16, n_local=64, seed=3, reserve_tokens=8)
    eager_cache = ssa.hf.SSACache(model, **kw)
    eager = _generate(model, eager_cache, ids, 32, compiled=False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cache = ssa.hf.SSACache(model, **kw)
    assert cache.is_compileable
    assert not ssa.hf.SSACache(model, backend="cpu").is_compileable  # its steps copy to the host
    got = _generate(model, cache, ids, 32, compiled=True)
    assert got.tolist() == eager.tolist()
    assert cache.get_seq_length() == eager_cache.get_seq_length() == 1500 + 31
    assert [len(s) for s in cache.sessions] == [1531]
    counters = torch._dynamo.utils.counters
    print("compiled generate (%s): %s frames compiled, cudagraph skips %s, %d reservations" % (
        method, dict(counters["stats"]), dict(counters["inductor"].get("cudagraph_skips", {}) or {}), cache._epoch))
    assert counters["stats"]["unique_graphs"] == 1  # one graph for every step and reservation
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert cache._epoch >= 4  # the reservation was renewed (31 steps, 8 at a time)


def test_compiled_generate_of_a_padded_batch_on_cuda_equals_eager():
    # The batch's rows sampled, each from its own length and position (a row alone
    # gives its tokens in a batch: tests_hf/test_hf_compiled.py, exact on the CPU;
    # here the batch's GEMMs round otherwise than one row's, and sampled selections
    # of a random model follow such differences).
    model = _model("ssa", torch.float32)
    long_, short = _ids(1024, 51)[0], _ids(300, 52)[0]
    pad = long_.shape[0] - short.shape[0]
    ids = torch.stack([long_, torch.cat([torch.zeros(pad, dtype=torch.long, device="cuda"), short])])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    kw = dict(method="ssa", budget=160, n_sink=16, n_local=64, seed=9, reserve_tokens=16)
    eager_cache, cache = ssa.hf.SSACache(model, **kw), ssa.hf.SSACache(model, **kw)
    eager = _generate(model, eager_cache, ids, 20, compiled=False, mask=mask)
    out = _generate(model, cache, ids, 20, compiled=True, mask=mask)
    assert out.tolist() == eager.tolist()
    assert [len(s) for s in cache.sessions] == [len(s) for s in eager_cache.sessions] == [1024 + 19, 300 + 19]


def test_a_cache_outside_its_reservation_is_detected():
    # A graph replayed after its reservation ended does nothing; the next step's
    # check says so instead of returning that token's unwritten output.
    model = _model("ssa", torch.float32)
    ids = _ids(700, 61)
    cache = ssa.hf.SSACache(model, method="ssa", budget=100, n_sink=16, n_local=32, reserve_tokens=4)
    with torch.no_grad():
        model(ids, past_key_values=cache)
        cache.prepare_step()
        s = cache.sessions[0]
        k = torch.randn(8, 128, device="cuda")
        q = torch.randn(32, 128, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            s.decode_step(0, k, k, q, method="ssa", budget=100, n_sink=16, n_local=32,
                          stream=torch.cuda.current_stream())
        graph.replay()
        cache.sessions[0].reserve(4)  # the reservation the graph was captured under ends
        cache._left = 4
        graph.replay()  # does nothing, counted
        with pytest.raises(RuntimeError, match="did nothing"):
            cache.prepare_step()


def test_generate_on_a_tiered_runtime_spills_and_equals_the_device_only_tiers():
    # A runtime with a device K/V budget (pages spill to the host): its caches take
    # reservations and compile as others. With a budget that holds a third of the
    # pages, generate gives the tokens of a budget that holds them all (tiered
    # decodes are bitwise the same wherever the rows are), eagerly and compiled
    # (CUDA graphs, the reservation renewed every 8 tokens: pages move and the
    # cache of host pages learns at each renewal), and reads rows from the host
    # where the other reads none.
    model = _model("ssa", torch.float32)
    ids = _ids(3000, 71)
    kw = dict(method="ssa", sparsity=10, n_sink=16, n_local=64, seed=5, reserve_tokens=8)
    runs = []
    # 2 layers x 8 KV heads x 128 x 4 B x 2 (K and V): 16 KiB per token, 47 MiB in all.
    for budget, compiled in ((1 << 30, False), (16 << 20, False), (16 << 20, True)):
        torch._dynamo.reset()
        rt = ssa.Runtime(backend="cuda", device_kv_budget=budget, host_cache_bytes=4 << 20)
        cache = ssa.hf.SSACache(model, runtime=rt, **kw)
        assert cache.is_compileable
        out = _generate(model, cache, ids, 24, compiled=compiled)
        seen = []
        cache.observer = lambda layer, q, o, stats, c: seen.append((stats[0].rows_from_host,
                                                                    stats[0].host_cache_hits))
        _generate(model, cache, out, 9, compiled=False)  # renews once: the cache has learnt
        runs.append((out.tolist(), sum(s[0] for s in seen), sum(s[1] for s in seen)))
    (all_on_device, none, no_hits), (spilled, from_host, hits), (graphed, from_host_g, hits_g) = runs
    print("tiered generate: rows from host %d / %d, cache hits %d / %d" % (from_host, from_host_g, hits, hits_g))
    assert spilled == all_on_device
    assert graphed == all_on_device
    assert none == 0 and no_hits == 0
    assert from_host > 0 and from_host_g > 0
    assert hits > 0 and hits_g > 0
    assert len(cache.sessions[0]) == 3000 + 23 + 8


@pytest.mark.parametrize("budget", [0, 8 << 20])
def test_a_chunk_after_decodes_runs_as_decode_steps_and_equals_appends_then_decodes(budget):
    # A multi-token chunk after decodes (an agent's next message) goes through decode
    # steps on CUDA, inside one reservation that holds the whole chunk on every layer,
    # untiered and tiered (budget 8 MiB of 23 MiB: pages on the host). It generates
    # what the per-token appends and decodes generate.
    model = _model("ssa", torch.float32)
    ids = _ids(1500, 81)
    msg = _ids(37, 82)  # more than the 8 tokens a reservation takes
    kw = dict(method="ssa", budget=200, n_sink=16, n_local=64, seed=3, reserve_tokens=8)
    runs = []
    for chunk_steps in (True, False):
        cache = ssa.hf.SSACache(model, runtime=ssa.Runtime(backend="cuda", device_kv_budget=budget), **kw)
        if not chunk_steps:
            cache._chunk_steps = lambda mask, t: False
        out = _generate(model, cache, ids, 4, compiled=False)
        epoch = cache._epoch
        got = _generate(model, cache, torch.cat([out, msg], dim=1), 6, compiled=False)
        runs.append((got.tolist(), cache._epoch - epoch, len(cache.sessions[0])))
    (steps, renewed, n_steps), (plain, _, n_plain) = runs
    assert steps == plain
    assert n_steps == n_plain == 1500 + 4 + 37 + 5
    assert renewed >= 1  # the chunk's reservation


RESUME = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import test_hf_cuda as t
import ssa.hf, torch
model = t._model("ssa", torch.float32)
first = torch.tensor(json.loads(sys.argv[3]), device="cuda")
cache = ssa.hf.SSACache.load(sys.argv[2], model)
assert cache.runtime.backend == "cuda" and cache.sessions[0].config.proxy.name == sys.argv[5], cache.sessions[0].config
print(json.dumps(t._generate(model, cache, first, int(sys.argv[4]), compiled=sys.argv[6] == "1").tolist()))
"""


@pytest.mark.parametrize("proxy,compiled", [("pq", False), ("qpq", True)])
def test_a_cuda_cache_saved_and_loaded_in_a_new_process_resumes_exactly(proxy, compiled, tmp_path):
    """A user's long session on the GPU: past the index threshold (the index trains
    at the first decode, QPQ from the prefill's queries), saved after a few tokens,
    loaded by another process into a fresh CUDA runtime, generates the tokens of
    the run that was never stopped."""
    model = _model("ssa", torch.float32)
    ids = _ids(5000, 91)
    kw = dict(method="ssa", sparsity=20, n_sink=16, n_local=64, seed=7, proxy=proxy)
    full = _generate(model, ssa.hf.SSACache(model, **kw), ids, 12, compiled=False)[0].tolist()
    cache = ssa.hf.SSACache(model, **kw)
    first = _generate(model, cache, ids, 6, compiled=False)
    assert first[0].tolist() == full[:5006]
    assert cache.runtime.backend == "cuda"
    cache.save(tmp_path / "cache")
    del cache
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", RESUME, here, str(tmp_path / "cache"), json.dumps(first.tolist()), "6",
                        proxy.upper(), "1" if compiled else "0"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [full]
