"""SSACache on transformers' compiled path, on the CPU: generate compiles the decode
forward (as it does on CUDA, with CUDA graphs there), libssa's step enters the graph
as the custom op torch.ops.ssa.decode_step, one graph serves every step (no graph
break, no recompilation), and the tokens equal the eager SSACache's. The CUDA-graph
replays themselves run in tests/test_hf_cuda.py on a GPU."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ssa.hf  # noqa: E402

pytestmark = pytest.mark.model


def _llama(layers=2, seed=0):
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=192, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=4096, initializer_range=0.1)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa").eval()


def _ids(n, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 97, (batch, n), generator=g)


class _Recorder:
    """A torch.compile backend that keeps every graph it is given and runs it as is."""

    def __init__(self):
        self.graphs = []

    def __deepcopy__(self, memo):  # generate deep-copies its compile config
        return self

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def step_ops(self):
        return sum(1 for g in self.graphs for n in g.graph.nodes
                   if n.op == "call_function"
                   and n.target in (torch.ops.ssa.decode_step, torch.ops.ssa.decode_step.default))


def _compiled_generate(model, cache, ids, n, mask=None):
    rec = _Recorder()
    cc = transformers.CompileConfig(backend=rec, mode=None, fullgraph=True, dynamic=False)
    cc._compile_all_devices = True  # generate compiles on CUDA only unless told otherwise
    torch._dynamo.reset()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=n, do_sample=False,
                             compile_config=cc, pad_token_id=0)
    return out, rec


def _eager_generate(model, cache, ids, n, mask=None):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=n, do_sample=False,
                              disable_compile=True, pad_token_id=0)


@pytest.mark.parametrize("method", ["ssa", "pq_topk"])
def test_compiled_generate_equals_eager_with_one_graph(method):
    model = _llama()
    ids = _ids(300)
    kw = dict(method=method, budget=48, n_sink=8, n_local=16, seed=5)
    eager = _eager_generate(model, ssa.hf.SSACache(model, **kw), ids, 10)
    cache = ssa.hf.SSACache(model, **kw)
    assert cache.is_compileable
    compiled, rec = _compiled_generate(model, cache, ids, 10)
    assert compiled.tolist() == eager.tolist()
    # One graph for all nine compiled steps (fullgraph: no break), with one step op per layer.
    assert len(rec.graphs) == 1 and rec.step_ops() == 2
    assert cache.get_seq_length() == 309
    st = cache.last_stats[0][0]  # the last step of layer 0, run by the op
    assert st.context_tokens == 309
    if method != "dense":  # a sparse step read fewer rows than the context
        assert 0 < st.tokens_read < 309 * 4


def test_compiled_generate_of_a_padded_batch_equals_eager():
    model = _llama()
    ids = _ids(280, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :37] = 0
    ids[1, :37] = 0
    kw = dict(method="ssa", budget=40, n_sink=8, n_local=16, seed=2)
    eager = _eager_generate(model, ssa.hf.SSACache(model, **kw), ids, 8, mask)
    compiled, rec = _compiled_generate(model, ssa.hf.SSACache(model, **kw), ids, 8, mask)
    assert compiled.tolist() == eager.tolist()
    assert len(rec.graphs) == 1
    # Each row alone gives its tokens in the batch (the RNG step of a token is its
    # position in its own row, padding not counted).
    alone = _eager_generate(model, ssa.hf.SSACache(model, **kw), ids[1:, 37:], 8)
    assert alone[0, -8:].tolist() == eager[1, -8:].tolist()


def test_caches_that_cannot_compile_say_so():
    model = _llama()
    assert ssa.hf.SSACache(model).is_compileable
    assert not ssa.hf.SSACache(model, observer=lambda *a: None).is_compileable
    assert not ssa.hf.SSACache(model, traces=True).is_compileable
    assert not ssa.hf.SSACache(model, group_selection="mixture").is_compileable
    assert ssa.hf.SSACache(model, group_selection="mean_query").is_compileable
    cfg = transformers.Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                        query_pre_attn_scalar=32, sliding_window=16,
                                        layer_types=["sliding_attention", "full_attention"])
    gemma = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa").eval()
    assert not ssa.hf.SSACache(gemma).is_compileable  # its sliding layers live on a dynamic cache
    with pytest.raises(ValueError, match="reserve_tokens"):
        ssa.hf.SSACache(model, reserve_tokens=0)


def test_the_index_is_trained_at_the_first_decode_not_in_the_prefill():
    model = _llama()
    ids = _ids(400)
    cache = ssa.hf.SSACache(model, method="ssa", budget=48, n_sink=8, n_local=16)
    with torch.no_grad():
        model(ids, past_key_values=cache)
    assert cache.sessions[0].config.index_min_tokens == 0xFFFFFFFF
    out = _eager_generate(model, cache, torch.cat([ids, ids[:, :1]], dim=1), 3)
    st = cache.last_stats[0][0]
    assert out.shape[1] == 404 and st.context_tokens == 403 and 0 < st.tokens_read < 403 * 4
