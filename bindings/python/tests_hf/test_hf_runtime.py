"""SSACache on a runtime the caller builds and shares (SSACache(runtime=...),
SSACache.load(..., runtime=...)): many caches and batches on one runtime decode as
caches on runtimes of their own, a sharded runtime decodes as one, a cache saved on
one runtime resumes on another, an interrupted save resumes from its rows, and a
runtime that does not fit a cache is refused naming the option."""
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ssa  # noqa: E402
import ssa.hf  # noqa: E402
from ssa.hf import _runtime  # noqa: E402

pytestmark = pytest.mark.model

SPARSE = dict(method="ssa", sparsity=6, n_sink=4, n_local=4, seed=11)


def _llama(seed=0, layers=2, positions=4096):
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=192, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=positions, initializer_range=0.1)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa").eval()


def _ids(n, seed=1, batch=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (batch, n), generator=g)


def _logits(model, cache, ids, n_prompt):
    """Prefill ids[:, :n_prompt], then one token per forward; logits of every step."""
    out = []
    with torch.no_grad():
        out.append(model(ids[:, :n_prompt], past_key_values=cache).logits[:, -1])
        for t in range(n_prompt, ids.shape[1]):
            out.append(model(ids[:, t:t + 1], past_key_values=cache).logits[:, -1])
    return torch.stack(out, dim=1)


def _generate(model, cache, ids, n):
    with torch.no_grad():
        return model.generate(ids, past_key_values=cache, max_new_tokens=n, do_sample=False)


def test_many_caches_and_batches_share_one_runtime():
    model = _llama()
    prompts = [_ids(260, seed=s) for s in (1, 2)] + [_ids(240, seed=3, batch=2)]
    with ssa.Runtime(backend="cpu", threads=2) as rt:
        shared = [ssa.hf.SSACache(model, runtime=rt, **SPARSE) for _ in prompts]
        # Interleaved: every cache's steps run between the others' on the same runtime.
        got = [[] for _ in prompts]
        with torch.no_grad():
            for c, p, g in zip(shared, prompts, got):
                g.append(model(p[:, :200], past_key_values=c).logits[:, -1])
            for t in range(200, 220):
                for c, p, g in zip(shared, prompts, got):
                    g.append(model(p[:, t:t + 1], past_key_values=c).logits[:, -1])
        for c in shared:
            assert c.runtime is rt and all(s.runtime is rt for s in c.sessions)
        assert [c.batch_size for c in shared] == [1, 1, 2]
        for p, g in zip(prompts, got):
            alone = ssa.hf.SSACache(model, **SPARSE)  # a runtime of its own, as before
            want = _logits(model, alone, p[:, :220], 200)
            assert alone.runtime is not rt
            assert torch.equal(torch.stack(g, dim=1), want)
        # The sparse decode really selected (SSA at 6x over 220 tokens reads about 37 rows).
        st = shared[0].last_stats[1][0]
        assert 0 < st.tokens_read < st.context_tokens * 4
    # Closed with live sessions: the runtime lives until its last session goes.
    more = _generate(model, shared[0], prompts[0][:, :221], 2)
    assert more.shape[1] == 223


def test_runtime_seed_is_the_default_of_caches_without_a_seed():
    model = _llama()
    ids = _ids(300)
    kw = dict(method="sampling", sparsity=10, n_sink=4, n_local=4, seed=0)
    outs = []
    for seed in (None, None, 99):
        rt = ssa.Runtime(backend="cpu", seed=seed) if seed is not None else None
        outs.append(_logits(model, ssa.hf.SSACache(model, runtime=rt, **kw), ids, 240))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])  # samples drawn with the runtime's seed


def test_sharded_runtime_decodes_as_one():
    model = _llama(positions=20000)
    ids = _ids(8192 + 300)
    kw = dict(method="ssa", sparsity=20, n_sink=16, n_local=16, seed=5)
    one = _logits(model, ssa.hf.SSACache(model, **kw), ids, 8192 + 296)
    rt = ssa.Runtime(backend="cpu", devices=[0, 1, 2], shard_tokens=8192)
    assert rt.shards == 3 and rt.options["devices"] == (0, 1, 2) and rt.options["shard_tokens"] == 8192
    cache = ssa.hf.SSACache(model, runtime=rt, **kw)
    sharded = _logits(model, cache, ids, 8192 + 296)
    assert torch.equal(sharded, one)  # bitwise: the sharded decode makes the same selection
    assert cache.last_stats[1][0].context_tokens == 8192 + 300


def test_load_into_a_given_runtime_resumes_equal(tmp_path):
    model = _llama()
    ids = _ids(220)
    full = _generate(model, ssa.hf.SSACache(model, **SPARSE), ids, 10)
    saver = ssa.Runtime(backend="cpu", threads=1)
    cache = ssa.hf.SSACache(model, runtime=saver, **SPARSE)
    first = _generate(model, cache, ids, 4)
    cache.save(tmp_path / "c")
    other = ssa.Runtime(backend="cpu", threads=2, device_kv_budget=1 << 20)  # the budget: CUDA only
    loaded = [ssa.hf.SSACache.load(tmp_path / "c", model, runtime=other) for _ in range(2)]
    for c in loaded:
        assert c.runtime is other and c.sessions[0].runtime is other
        assert _generate(model, c, first, 6).tolist() == full.tolist()
    with pytest.raises(ssa.InvalidArgument, match="backend"):
        ssa.hf.SSACache.load(tmp_path / "c", model, backend="cuda", runtime=other)


def test_interrupted_save_resumes_from_its_rows(tmp_path):
    """A save killed after its row snapshots were committed and before the manifest
    was replaced: the rows are the later state and load takes it."""
    model = _llama()
    ids = _ids(220)
    full = _generate(model, ssa.hf.SSACache(model, **SPARSE), ids, 9)
    cache = ssa.hf.SSACache(model, **SPARSE)
    first = _generate(model, cache, ids, 3)
    cache.save(tmp_path / "c")
    old_manifest = (tmp_path / "c" / "cache.json").read_bytes()
    second = _generate(model, cache, first, 3)
    cache.save(tmp_path / "c")
    (tmp_path / "c" / "cache.json").write_bytes(old_manifest)  # as if killed before the manifest
    loaded = ssa.hf.SSACache.load(tmp_path / "c", model)
    assert loaded.get_seq_length() == second.shape[1] - 1
    assert _generate(model, loaded, second, 3).tolist() == full.tolist()
    # Rows behind the manifest are not an interrupted save: refused.
    m = json.loads(old_manifest)
    m["positions"] = second.shape[1] + 5
    (tmp_path / "c" / "cache.json").write_text(json.dumps(m))
    with pytest.raises(ssa.InvalidArgument, match="manifest says"):
        ssa.hf.SSACache.load(tmp_path / "c", model)


def test_a_runtime_that_does_not_fit_is_refused_naming_the_option():
    model = _llama()
    rt = ssa.Runtime(backend="cpu")
    with pytest.raises(ssa.InvalidArgument, match=r"backend='cuda'.*ssa.Runtime\(backend=\.\.\.\)"):
        ssa.hf.SSACache(model, backend="cuda", runtime=rt)
    with pytest.raises(ssa.InvalidArgument, match=r"threads.*ssa.Runtime\(threads=\.\.\.\)"):
        ssa.hf.SSACache(model, threads=2, runtime=rt)
    with pytest.raises(ssa.InvalidArgument, match="takes an ssa.Runtime"):
        ssa.hf.SSACache(model, runtime="cpu")
    closed = ssa.Runtime(backend="cpu")
    closed.close()
    with pytest.raises(ssa.InvalidArgument, match="closed"):
        ssa.hf.SSACache(model, runtime=closed)
    # A CPU runtime with a matching backend, and one runtime holding caches of
    # several dtypes (each cache's sessions take its model's K/V dtype).
    ssa.hf.SSACache(model, backend="cpu", runtime=rt)
    half = _llama().to(torch.bfloat16)
    caches = [ssa.hf.SSACache(m, runtime=rt, **SPARSE) for m in (model, half)]
    for m, c in zip((model, half), caches):
        _generate(m, c, _ids(40), 2)
    assert [c.dtype for c in caches] == ["float32", "bfloat16"]


class _CudaRuntimeStandIn:
    """What check_tensors reads of a CUDA runtime (no GPU on the CPU CI)."""

    def __init__(self, device=0, devices=None):
        self.backend, self.closed = "cuda", False
        self.device = devices[0] if devices else device
        self.options = {"devices": devices}


def test_device_fit_rules_of_a_cuda_runtime():
    rt = _CudaRuntimeStandIn(device=1)
    _runtime.check_tensors(rt, torch.device("cuda", 1), "x")
    with pytest.raises(ssa.InvalidArgument, match=r"x on cpu, but the runtime is a CUDA runtime on cuda:1"):
        _runtime.check_tensors(rt, torch.device("cpu"), "x")
    with pytest.raises(ssa.InvalidArgument, match=r"cuda:0.*ssa.Runtime\(device=1\).*device=0"):
        _runtime.check_tensors(rt, torch.device("cuda", 0), "x")
    sharded = _CudaRuntimeStandIn(devices=(2, 3))
    _runtime.check_tensors(sharded, torch.device("cuda", 2), "x")
    with pytest.raises(ssa.InvalidArgument, match=r"devices\[0\]=2"):
        _runtime.check_tensors(sharded, torch.device("cuda", 3), "x")
    # A CPU runtime takes tensors of any device (copied to the host).
    _runtime.check_tensors(ssa.Runtime(backend="cpu"), torch.device("cuda", 0), "x")


def test_page_tokens_reach_the_sessions_and_are_checked(tmp_path):
    model = _llama()
    cache = ssa.hf.SSACache(model, page_tokens=16, **SPARSE)
    _generate(model, cache, _ids(50), 2)
    assert cache.sessions[0].config.page_tokens == 16
    cache.save(tmp_path / "c")
    assert ssa.hf.SSACache.load(tmp_path / "c", model).sessions[0].config.page_tokens == 16  # from the snapshot
    for bad in (15, 24, 8192, True, "16"):
        with pytest.raises(ssa.InvalidArgument, match="page_tokens"):
            ssa.hf.SSACache(model, page_tokens=bad)


def _prefill_kv(model, ids):
    """Every layer's K/V of a prompt, from transformers' own cache after a forward."""
    with torch.no_grad():
        dyn = transformers.DynamicCache(config=model.config)
        model(ids, past_key_values=dyn)
    return [(layer.keys, layer.values) for layer in dyn.layers]


@pytest.mark.parametrize("n", [1, 7, 300])
def test_append_kv_continues_like_a_prefill(n):
    """K/V of n prompt tokens handed over with append_kv, then the model runs on: the
    logits of every step equal a cache that ran the prefill itself (dense decode, so
    the comparison is exact up to float rounding), for a batch of two."""
    model = _llama()
    ids = _ids(n + 6, batch=2)
    kv = _prefill_kv(model, ids[:, :n])
    ref = ssa.hf.SSACache(model, method="dense")
    want = _logits(model, ref, ids, n)[:, 1:]
    cache = ssa.hf.SSACache(model, method="dense")
    for layer, (k, v) in enumerate(kv):
        cache.append_kv(layer, k, v)
    assert cache.get_seq_length() == n and len(cache.sessions[1]) == n
    got = []
    with torch.no_grad():
        for t in range(n, ids.shape[1]):
            got.append(model(ids[:, t:t + 1], past_key_values=cache).logits[:, -1])
    torch.testing.assert_close(torch.stack(got, dim=1), want, rtol=1e-4, atol=1e-4)
    assert cache.get_seq_length() == n + 6


def test_append_kv_then_generate_sparse_equals_prefilled_cache():
    """generate on a cache filled by append_kv (all but the prompt's last token) gives
    the tokens of a cache whose prefill of those tokens ran in the model, SSA 6x, past
    the index (in both, generate decodes the prompt's last token). PQ: a query-aware
    index (the default) learns from the prefill's queries, which append_kv has not."""
    model = _llama()
    ids = _ids(700)
    prefilled = ssa.hf.SSACache(model, proxy="pq", **SPARSE)
    with torch.no_grad():
        model(ids[:, :-1], past_key_values=prefilled)
    ref = _generate(model, prefilled, ids, 8)
    cache = ssa.hf.SSACache(model, proxy="pq", **SPARSE)
    for layer, (k, v) in enumerate(_prefill_kv(model, ids[:, :-1])):
        cache.append_kv(layer, k, v)
    got = _generate(model, cache, ids, 8)
    assert got.tolist() == ref.tolist()


def test_append_kv_refusals_change_nothing():
    model = _llama()
    cache = ssa.hf.SSACache(model, method="dense")
    kv = _prefill_kv(model, _ids(5))
    k, v = kv[0]
    with pytest.raises(ssa.InvalidArgument, match="expected both"):
        cache.append_kv(0, k[:, :1], v)
    with pytest.raises(ssa.InvalidArgument, match="not a layer"):
        cache.append_kv(2, k, v)
    cache.append_kv(0, k, v)
    with pytest.raises(ssa.InvalidArgument, match="batch 2"):
        cache.append_kv(1, torch.cat([k, k]), torch.cat([v, v]))
    assert len(cache.sessions) == 1
    assert (cache.sessions[0].layer_length(0), cache.sessions[0].layer_length(1)) == (5, 0)
