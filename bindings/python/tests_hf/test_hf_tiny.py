"""ssa.hf on small randomly initialised models (no weights to download): decode
logits through SSACache against transformers' own sdpa forward over the whole
sequence, batches with padding, sliding-window layers, save/load, fork, truncate,
the wrong-model refusal and bad parameters."""
import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ssa  # noqa: E402
import ssa.hf  # noqa: E402

pytestmark = pytest.mark.model


def _llama(seed=0, layers=2, **kw):
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=192, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=4096, initializer_range=0.1, **kw)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa").eval()


def _gemma(seed=0):
    cfg = transformers.Gemma3TextConfig(vocab_size=97, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                        query_pre_attn_scalar=32, sliding_window=16,
                                        layer_types=["sliding_attention", "full_attention"] * 2,
                                        max_position_embeddings=4096, initializer_range=0.1)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa").eval()


def _ids(n, seed=1, batch=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (batch, n), generator=g)


def _sdpa_logits(model, ids, mask=None):
    """Logits of every position from one plain forward with transformers' sdpa."""
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            return model(ids, attention_mask=mask).logits
    finally:
        model.set_attn_implementation("ssa")


def _stepwise_logits(model, cache, ids, n_prompt, mask=None):
    """Prefill ids[:, :n_prompt], then one token per forward; logits of every step."""
    out = []
    with torch.no_grad():
        m = None if mask is None else mask[:, :n_prompt]
        out.append(model(ids[:, :n_prompt], attention_mask=m, past_key_values=cache).logits[:, -1])
        for t in range(n_prompt, ids.shape[1]):
            m = None if mask is None else mask[:, :t + 1]
            out.append(model(ids[:, t:t + 1], attention_mask=m, past_key_values=cache).logits[:, -1])
    return torch.stack(out, dim=1)  # [batch, steps, vocab]


@pytest.mark.parametrize("make", [_llama, _gemma], ids=["llama", "gemma3-sliding"])
@pytest.mark.parametrize("method", ["dense", "ssa", "pq_topk", "oracle_topk", "hybrid_uniform", "sampling",
                                    "ssa_adaptive"])
def test_decode_logits_equal_sdpa_at_full_budget(make, method):
    model = make()
    ids = _ids(300)
    want = _sdpa_logits(model, ids)[:, 239:]
    kw = {} if method == "dense" else dict(budget=10 ** 6)
    cache = ssa.hf.SSACache(model, method=method, n_sink=4, n_local=4, **kw)
    got = _stepwise_logits(model, cache, ids, 240)
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()
    assert cache.get_seq_length() == 300
    assert [len(s) for s in cache.sessions] == [300]
    if method != "dense":
        st = cache.last_stats[cache.shape.full_layers[-1]][0]
        assert st.context_tokens == 300


@pytest.mark.parametrize("group", ["mixture", "mean_query"])
def test_group_selection_is_exact_at_full_budget_and_sparse_below(group):
    model = _llama()
    ids = _ids(300)
    want = _sdpa_logits(model, ids)[:, 239:]
    cache = ssa.hf.SSACache(model, method="ssa", budget=10 ** 6, n_sink=4, n_local=4, group_selection=group)
    got = _stepwise_logits(model, cache, ids, 240)
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=10, n_sink=8, n_local=8, group_selection=group)
    _stepwise_logits(model, cache, ids, 240)
    st = cache.last_stats[0][0]
    assert st.context_tokens == 300 and st.draws > 0


def test_sparse_decode_differs_and_reads_fewer_rows():
    model = _llama()
    ids = _ids(600)
    want = _sdpa_logits(model, ids)[:, 499:]
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=10, n_sink=8, n_local=8)
    got = _stepwise_logits(model, cache, ids, 500)
    assert not torch.allclose(got, want, atol=1e-5)
    st = cache.last_stats[0][0]
    assert st.context_tokens == 600
    assert 0 < st.tokens_read <= 4 * 60  # summed over the 4 query heads: N / 10 each


def test_batch_with_left_padding_equals_each_sequence_alone():
    model = _llama()
    a, b = _ids(260, seed=3)[0], _ids(200, seed=4)[0]
    pad = a.shape[0] - b.shape[0]
    ids = torch.stack([a, torch.cat([torch.zeros(pad, dtype=torch.long), b])])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    cache = ssa.hf.SSACache(model, method="dense")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=6, do_sample=False,
                             pad_token_id=0)
    assert [len(s) for s in cache.sessions] == [260 + 5, 200 + 5]  # padding not stored
    for row, seq in ((0, a), (1, b)):
        alone = ssa.hf.SSACache(model, method="dense")
        with torch.no_grad():
            ref = model.generate(seq[None], past_key_values=alone, max_new_tokens=6, do_sample=False)
        assert out[row, -6:].tolist() == ref[0, -6:].tolist()


def test_observer_and_decode_reference():
    model = _llama()
    ids = _ids(400)
    seen = []

    def observer(layer_idx, q, out, stats, cache):
        ref = cache.decode_reference(layer_idx, q, method="dense")
        err = float((out - ref).norm() / ref.norm())
        seen.append((layer_idx, tuple(q.shape), tuple(out.shape), len(stats), err))

    cache = ssa.hf.SSACache(model, method="ssa", sparsity=8, n_sink=8, n_local=8, observer=observer)
    with torch.no_grad():
        model.generate(ids, past_key_values=cache, max_new_tokens=3, do_sample=False)
    assert len(seen) == 2 * 2  # 2 decode steps (the first token comes from the prefill) x 2 layers
    assert all(s[1] == (1, 4, 32) and s[2] == (1, 4, 32) and s[3] == 1 for s in seen)
    assert all(0 < s[4] < 1 for s in seen)  # sparse, and not garbage
    assert cache.layer_of(1) == 1


def test_traces_are_recorded_without_changing_the_decode():
    model = _llama()
    ids = _ids(400)
    kw = dict(method="ssa", sparsity=8, n_sink=8, n_local=8, seed=5)
    plain = ssa.hf.SSACache(model, **kw)
    traced = ssa.hf.SSACache(model, traces=True, **kw)
    seen = {}

    def observer(layer_idx, q, out, stats, cache):
        seen.setdefault(layer_idx, []).append((cache.last_traces[layer_idx][0], stats[0].tokens_read))

    traced.observer = observer
    assert _generate(model, plain, ids, 4).tolist() == _generate(model, traced, ids, 4).tolist()
    assert sorted(seen) == [0, 1] and all(len(v) == 3 for v in seen.values())
    for steps in seen.values():
        for tr, read in steps:
            assert len(tr) == 4 and int(tr.offsets[-1]) == read
            for h in range(4):
                rows = tr.head(h).tolist()
                assert rows == sorted(set(rows)) and rows[:8] == list(range(8))
        # step t attends over one more token than step t-1
        assert steps[1][0].head(0)[-1] == steps[0][0].head(0)[-1] + 1
    assert plain.last_traces == {}


def _generate(model, cache, ids, n):
    with torch.no_grad():
        return model.generate(ids, past_key_values=cache, max_new_tokens=n, do_sample=False)


@pytest.mark.parametrize("make", [_llama, _gemma], ids=["llama", "gemma3-sliding"])
def test_save_load_fork_resume_equal_uninterrupted(make, tmp_path):
    model = make()
    ids = _ids(200)
    kw = dict(method="ssa", sparsity=6, n_sink=4, n_local=4, seed=7)
    full = _generate(model, ssa.hf.SSACache(model, **kw), ids, 12)
    cache = ssa.hf.SSACache(model, **kw)
    first = _generate(model, cache, ids, 5)
    assert first.tolist() == full[:, :205].tolist()
    cache.save(tmp_path / "c")
    branch = cache.fork()
    assert _generate(model, cache, first, 7).tolist() == full.tolist()
    assert _generate(model, branch, first, 7).tolist() == full.tolist()
    loaded = ssa.hf.SSACache.load(tmp_path / "c", model)
    assert loaded.params == cache.params and loaded.get_seq_length() == 204
    assert _generate(model, loaded, first, 7).tolist() == full.tolist()
    # A second save of the grown cache is a checkpoint into the same folder.
    cache.save(tmp_path / "c")
    again = ssa.hf.SSACache.load(tmp_path / "c", model)
    assert again.get_seq_length() == cache.get_seq_length() == 211


@pytest.mark.parametrize("turns", [1, 2], ids=["after-the-prompt", "after-a-second-prompt"])
def test_query_aware_cache_saved_between_prefill_and_decode_continues_as_uninterrupted(turns, tmp_path):
    """A document read (prefilled) and saved before any question is decoded, or a
    second message prefilled after a reply: the queries the prefill showed the
    cache's query-aware proxy are in the save, so the loaded cache trains the index
    the uninterrupted one trains (at its first decode, or when a third message
    grows it enough to retrain) and its logits are bit for bit the same."""
    model = _llama()
    ids = _ids(480)
    kw = dict(method="ssa", sparsity=6, n_sink=4, n_local=4, seed=3)
    # prompt | reply (decoded) | second prompt | (after the save) third prompt
    cuts = [150] if turns == 1 else [100, 104, 200, 460]

    def run(save_at_end):
        cache = ssa.hf.SSACache(model, **kw)
        assert cache.sessions == [] or cache.sessions[0].config.proxy == ssa.Proxy.QPQ
        with torch.no_grad():
            model(ids[:, :cuts[0]], past_key_values=cache)
            if turns == 2:
                for t in range(cuts[0], cuts[1]):
                    model(ids[:, t:t + 1], past_key_values=cache)
                model(ids[:, cuts[1]:cuts[2]], past_key_values=cache)
        if save_at_end:
            cache.save(tmp_path / "c")
            cache = ssa.hf.SSACache.load(tmp_path / "c", model)
        assert cache.sessions[0].config.proxy == ssa.Proxy.QPQ
        with torch.no_grad():
            if turns == 2:
                model(ids[:, cuts[2]:cuts[3]], past_key_values=cache)
            return torch.stack([model(ids[:, t:t + 1], past_key_values=cache).logits[:, -1]
                                for t in range(cuts[-1], cuts[-1] + 12)], dim=1)

    assert torch.equal(run(False), run(True))


@pytest.mark.parametrize("storage", [dict(proxy="pq4"), dict(proxy="opq4"), dict(proxy="qpq4"), dict(proxy="opq"),
                                     dict(proxy="pq", page_tokens=64), {}],
                         ids=["pq4", "opq4", "qpq4", "opq", "pq-pages64", "default"])
def test_save_load_keeps_the_proxy_and_page_size(storage, tmp_path):
    """Every proxy and page size a cache can be made with loads back as itself
    (4-bit proxies have another PQ shape than the default), continues as the
    cache that was never saved, and makes its new sessions the same way after a reset."""
    model = _llama()
    ids = _ids(300)
    kw = dict(method="ssa", sparsity=6, n_sink=4, n_local=4, seed=5)
    full = _generate(model, ssa.hf.SSACache(model, **kw, **storage), ids, 10)
    cache = ssa.hf.SSACache(model, **kw, **storage)
    first = _generate(model, cache, ids, 4)
    saved = cache.sessions[0].config
    cache.save(tmp_path / "c")
    loaded = ssa.hf.SSACache.load(tmp_path / "c", model)
    got = loaded.sessions[0].config
    assert (got.proxy, got.pq_subspaces, got.pq_centroids, got.page_tokens) == \
        (saved.proxy, saved.pq_subspaces, saved.pq_centroids, saved.page_tokens)
    assert _generate(model, loaded, first, 6).tolist() == full.tolist()
    loaded.reset()
    _generate(model, loaded, ids[:, :40], 1)
    again = loaded.sessions[0].config
    assert (again.proxy, again.pq_subspaces, again.page_tokens) == (saved.proxy, saved.pq_subspaces, saved.page_tokens)


def test_load_checks_the_storage_against_the_rows(tmp_path):
    import json
    model = _llama()
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=6, proxy="pq4", page_tokens=64)
    _generate(model, cache, _ids(120), 2)
    cache.save(tmp_path / "c")
    man = tmp_path / "c" / "cache.json"
    good = json.loads(man.read_text())
    assert good["storage"] == {"proxy": "pq4", "pq_subspaces": 32, "pq_centroids": 16, "page_tokens": 64}
    for storage, msg in ((dict(good["storage"], proxy="qpq4"), "holds proxy 'pq4'"),
                         (dict(good["storage"], page_tokens=128), "has page_tokens 64"),
                         (dict(good["storage"], pq_subspaces=16), "which no SSACache makes"),
                         (dict(good["storage"], proxy="pq5"), "proxy='pq5'"),
                         (dict(good["storage"], page_tokens=100), "page_tokens=100"),
                         (dict(good["storage"], colour=1), "invalid storage entry"),
                         ("pq4", "invalid storage entry"),
                         ({"proxy": "pq"}, "pq_subspaces 32, expected 16")):
        man.write_text(json.dumps(dict(good, storage=storage)))
        with pytest.raises(ssa.Error, match=msg):
            ssa.hf.SSACache.load(tmp_path / "c", model)
    # A manifest from before the storage was recorded: the rows' own PQ shape.
    man.write_text(json.dumps({k: v for k, v in good.items() if k != "storage"}))
    old = ssa.hf.SSACache.load(tmp_path / "c", model)
    assert old.sessions[0].config.pq_subspaces == 32 and old._storage["proxy"] == "pq4"
    assert old.get_seq_length() == cache.get_seq_length()


@pytest.mark.parametrize("proxy", ["opq", "qpq", "pq4"])
def test_a_manifest_without_storage_makes_new_sessions_as_its_rows(proxy, tmp_path):
    """A cache saved before the manifest recorded the storage: after a reset, its
    new sessions take the rows' proxy, not the default."""
    import json
    model = _llama()
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=6, proxy=proxy)
    _generate(model, cache, _ids(120), 2)
    cache.save(tmp_path / "c")
    man = tmp_path / "c" / "cache.json"
    good = json.loads(man.read_text())
    man.write_text(json.dumps({k: v for k, v in good.items() if k != "storage"}))
    assert ssa.inspect(tmp_path / "c" / good["rows"][0]).proxy.name.lower() == proxy
    old = ssa.hf.SSACache.load(tmp_path / "c", model)
    old.reset()
    _generate(model, old, _ids(40), 1)
    assert old.sessions[0].config.proxy.name.lower() == proxy


def test_truncate_rolls_back_to_an_earlier_state():
    model = _llama()
    ids = _ids(220)
    kw = dict(method="ssa", sparsity=6, n_sink=4, n_local=4, seed=3)
    cache = ssa.hf.SSACache(model, **kw)
    first = _generate(model, cache, ids, 4)
    cont = _generate(model, cache, first, 6)
    cache.truncate(first.shape[1] - 1)
    assert cache.get_seq_length() == 223 and len(cache.sessions[0]) == 223
    assert _generate(model, cache, first, 6).tolist() == cont.tolist()
    # Another continuation from the rolled-back state is its own branch.
    cache.truncate(first.shape[1] - 1)
    other = torch.cat([first, torch.tensor([[5, 6, 7]])], dim=1)
    ref = _generate(model, ssa.hf.SSACache(model, **kw), ids, 4)
    assert ref.tolist() == first.tolist()
    _generate(model, cache, other, 2)
    assert cache.get_seq_length() == other.shape[1] + 1


def test_sliding_layers_cannot_roll_back_past_their_window():
    model = _gemma()
    cache = ssa.hf.SSACache(model, method="dense")
    _generate(model, cache, _ids(100), 3)
    with pytest.raises(ssa.InvalidArgument, match="sliding-window layer"):
        cache.truncate(50)
    assert cache.get_seq_length() == 102


def test_load_refuses_another_model(tmp_path):
    a, b = _llama(layers=2), _llama(layers=3)
    cache = ssa.hf.SSACache(a, method="dense")
    _generate(a, cache, _ids(50), 2)
    cache.save(tmp_path / "a")
    with pytest.raises(ssa.Mismatch, match="another model.*num_hidden_layers 2 vs 3"):
        ssa.hf.SSACache.load(tmp_path / "a", b)
    with pytest.raises(ssa.InvalidArgument, match="no saved cache"):
        ssa.hf.SSACache.load(tmp_path / "missing", a)


def test_load_checks_what_it_reads(tmp_path):
    model = _llama()
    cache = ssa.hf.SSACache(model, method="dense")
    _generate(model, cache, _ids(50), 2)
    cache.save(tmp_path / "c")
    import json
    man = tmp_path / "c" / "cache.json"
    good = json.loads(man.read_text())
    for bad, msg in ((dict(good, params=dict(good["params"], sparsity=0.5)), "sparsity"),
                     (dict(good, rows=["../x.ssa"]), "row snapshots"),
                     (dict(good, positions=-1), "position count"),
                     # Rows behind the manifest are refused (rows ahead of it are a save
                     # interrupted after its rows landed: load resumes from them).
                     (dict(good, positions=60), "holds 51 tokens"),
                     (dict(good, format="other/9"), "format")):
        man.write_text(json.dumps(bad))
        with pytest.raises(ssa.Error, match=msg):
            ssa.hf.SSACache.load(tmp_path / "c", model)
    man.write_text("{not json")
    with pytest.raises(ssa.InvalidArgument, match="not a valid manifest"):
        ssa.hf.SSACache.load(tmp_path / "c", model)
    (tmp_path / "c" / "row0.ssa").write_bytes(b"garbage" * 100)
    man.write_text(json.dumps(good))
    with pytest.raises(ssa.Error, match="row0.ssa"):
        ssa.hf.SSACache.load(tmp_path / "c", model)


@pytest.mark.parametrize("kw,msg", [
    (dict(method="fast"), "method='fast' is not one of"),
    (dict(sparsity=0.5), "sparsity"),
    (dict(sparsity=float("nan")), "sparsity"),
    (dict(budget=0), "budget"),
    (dict(budget=2.5), "budget must be an integer"),
    (dict(h=1.5), "h=1.5"),
    (dict(n_sink=-1), "n_sink"),
    (dict(seed=-3), "seed"),
    (dict(backend="tpu"), "backend='tpu'"),
    (dict(observer=3), "observer must be callable"),
    (dict(group_selection="sideways"), "group_selection='sideways' is not one of"),
])
def test_bad_parameters_are_refused(kw, msg):
    model = _llama()
    with pytest.raises(ssa.InvalidArgument, match=msg):
        ssa.hf.SSACache(model, **kw)
    cache = ssa.hf.SSACache(model)
    if "backend" not in kw and "observer" not in kw:
        with pytest.raises(ssa.InvalidArgument, match=msg):
            cache.set_params(**kw)
        assert cache.params["method"] == "ssa" and cache.params["sparsity"] == 20.0
    with pytest.raises(ssa.InvalidArgument, match="unknown decode parameter"):
        cache.set_params(sparsty=3)


def test_model_without_ssa_attention_is_refused():
    model = _llama()
    model.set_attn_implementation("sdpa")
    with pytest.raises(ssa.InvalidArgument, match="attn_implementation=\"ssa\""):
        ssa.hf.SSACache(model)


def test_repr_and_layer_map(capsys):
    model = _gemma()
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=10, progress_min_tokens=32)
    assert "no session yet" in repr(cache)
    _generate(model, cache, _ids(40), 2)
    assert "prefill 40 tokens" in capsys.readouterr().err  # the progress bar of a long prefill
    r = repr(cache)
    assert "4 layers, 2 in libssa (cpu float32), 2 sliding-window" in r and "41 position(s)" in r, r
    assert [cache.layer_of(i) for i in range(4)] == [None, 0, None, 1]
    with pytest.raises(ssa.InvalidArgument, match="not a layer"):
        cache.layer_of(4)


def test_attention_switched_away_from_ssa_is_reported():
    model = _llama()
    cache = ssa.hf.SSACache(model)
    model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(RuntimeError, match="layer 0: the attention call after the cache update"):
            _generate(model, cache, _ids(20), 2)
    finally:
        model.set_attn_implementation("ssa")
    dense = ssa.hf.SSACache(model, method="dense")
    assert _generate(model, dense, _ids(20), 2).shape == (1, 22)


SHORT_PROMPTS = (1, 2, 17, 255, 256, 300, 1024)
SPARSE_METHODS = ("ssa", "pq_topk", "oracle_topk", "hybrid_uniform", "sampling", "ssa_adaptive")


def _short_prompt_run(model, n, method, new=6):
    cache = ssa.hf.SSACache(model, method=method, sparsity=20)  # defaults: window 128 + 128
    with torch.no_grad():
        out = model.generate(_ids(n, seed=n), past_key_values=cache, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False)
    return out[0, n:].tolist(), cache


@pytest.mark.parametrize("n", SHORT_PROMPTS)
def test_short_prompts_generate_with_every_method(n):
    """Prompts from one token to past the window: below the window every method is
    exact (the whole context is read); past it at sparsity 20 the budget does not
    exceed sink + local, so every method reads the same window (and no index)."""
    model = _llama()
    dense, _ = _short_prompt_run(model, n, "dense")
    full = n + 5 <= 256  # the last decode's context fits in the window: exact
    for method in SPARSE_METHODS:
        got, cache = _short_prompt_run(model, n, method)
        assert len(got) == 6, method
        st = cache.last_stats[0][0]
        assert st.context_tokens == n + 5
        if full:
            assert got == dense, method
            assert st.window_only_heads == 0 and st.tokens_read == 4 * (n + 5)
        else:
            assert st.window_only_heads == 4 and st.tokens_read == 4 * 256 and st.scored_tokens == 0, method
            ref, _ = _short_prompt_run(model, n, "ssa")
            assert got == ref, method  # the same window, whatever the method


# Every sparse method reads the same window here (test_short_prompts_... shows it).
@pytest.mark.parametrize("method", ("dense", "ssa", "pq_topk"))
def test_batch_of_short_and_long_padded_prompts(method):
    model = _llama()
    long_, short = _ids(1024, seed=5)[0], _ids(17, seed=6)[0]
    pad = long_.shape[0] - short.shape[0]
    ids = torch.stack([long_, torch.cat([torch.zeros(pad, dtype=torch.long), short])])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    cache = ssa.hf.SSACache(model, method=method, sparsity=20)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=5, min_new_tokens=5,
                             do_sample=False, pad_token_id=0)
    assert [len(s) for s in cache.sessions] == [1024 + 4, 17 + 4]
    for row, seq in ((0, long_), (1, short)):
        alone = ssa.hf.SSACache(model, method=method, sparsity=20)
        with torch.no_grad():
            ref = model.generate(seq[None], past_key_values=alone, max_new_tokens=5, min_new_tokens=5,
                                 do_sample=False)
        assert out[row, -5:].tolist() == ref[0, -5:].tolist(), row


def _spy_observations(monkeypatch):
    """Records every Session.observe_queries call as (layer, copy of q), then runs it."""
    seen = []
    real = ssa.Session.observe_queries

    def spy(self, layer, q):
        seen.append((layer, q.clone()))
        return real(self, layer, q)

    monkeypatch.setattr(ssa.Session, "observe_queries", spy)
    return seen


@pytest.mark.parametrize("proxy", ["qpq", "qpq4"])
def test_query_aware_proxy_observes_the_prefills_last_queries(monkeypatch, proxy):
    model = _gemma()
    seen = _spy_observations(monkeypatch)
    # What the model's full-attention layers attend with: their query states, captured by hooking the
    # attention modules' forward (the query projection, norm and rotary embedding are the module's).
    queries = {}
    real_fwd = ssa.hf._attention.ssa_attention_forward

    def capture(module, query, key, value, mask, **kw):
        queries.setdefault(module.layer_idx, query.detach().clone())
        return real_fwd(module, query, key, value, mask, **kw)

    from transformers import AttentionInterface
    AttentionInterface.register("ssa", capture)
    try:
        ids = _ids(300)
        want = _sdpa_logits(model, ids)[:, 279:]
        cache = ssa.hf.SSACache(model, method="pq_topk", budget=10 ** 6, n_sink=4, n_local=4, proxy=proxy)
        got = _stepwise_logits(model, cache, ids, 280)
    finally:
        AttentionInterface.register("ssa", ssa.hf._attention.ssa_attention_forward)
    # Exact at full budget, whatever the proxy ranks.
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()
    assert cache.sessions[0].config.proxy == ssa.Proxy[proxy.upper()]
    # One observation per full-attention layer: the prefill's last 256 of 280 queries, as attended
    # (Gemma-3's query_pre_attn_scalar equals head_dim here: no scale fix).
    assert [layer for layer, _ in seen] == [0, 1]
    for (slot, q), model_layer in zip(seen, cache.shape.full_layers):
        ref = queries[model_layer][0].transpose(0, 1)[-256:]  # [256, n_q_heads, head_dim]
        assert q.shape == (256, 2, 32)
        assert torch.equal(q, ref.to(q.dtype))


def test_query_aware_proxy_padded_rows_observe_their_own_queries(monkeypatch):
    model = _llama()
    seen = _spy_observations(monkeypatch)
    a, b = _ids(120, seed=3)[0], _ids(90, seed=4)[0]
    ids = torch.stack([a, torch.cat([torch.zeros(30, dtype=torch.long), b])])
    mask = torch.ones_like(ids)
    mask[1, :30] = 0
    cache = ssa.hf.SSACache(model, method="ssa", sparsity=10, n_sink=4, n_local=4, proxy="qpq")
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=3, do_sample=False,
                       pad_token_id=0)
    # Two layers x two rows, each row its valid positions only.
    assert [(layer, q.shape[0]) for layer, q in seen] == [(0, 120), (0, 90), (1, 120), (1, 90)]


def test_proxy_option_is_checked_and_pq_sessions_observe_nothing(monkeypatch):
    model = _llama()
    with pytest.raises(ssa.InvalidArgument, match="proxy='ivf'"):
        ssa.hf.SSACache(model, proxy="ivf")
    seen = _spy_observations(monkeypatch)
    for proxy in ("pq", "opq4"):
        cache = ssa.hf.SSACache(model, method="pq_topk", sparsity=10, n_sink=4, n_local=4, proxy=proxy)
        _stepwise_logits(model, cache, _ids(200), 198)
        assert cache.sessions[0].config.proxy == ssa.Proxy[proxy.upper()]
    assert seen == []
    # The default on the CPU is the query-aware proxy, shown the prefill's queries of every layer.
    cache = ssa.hf.SSACache(model, method="pq_topk", sparsity=10, n_sink=4, n_local=4)
    _stepwise_logits(model, cache, _ids(200), 198)
    assert all(s.config.proxy == ssa.Proxy.QPQ for s in cache.sessions)
    assert sorted({layer for layer, _ in seen}) == list(range(model.config.num_hidden_layers))
    # On a CUDA runtime too, but PQ where its sessions are sharded over several
    # devices or processes (they take PQ only): the rule, read from the cache's runtime.
    rule = ssa.hf.SSACache._default_proxy
    assert rule(cache) == "qpq" and cache.runtime.backend == "cpu"

    def cuda(shards=1, collective=None):
        return types.SimpleNamespace(runtime=types.SimpleNamespace(backend="cuda", shards=shards,
                                                                   _collective=collective))
    assert rule(cuda()) == "qpq"
    assert rule(cuda(shards=2)) == "pq"
    assert rule(cuda(collective=object())) == "pq"
