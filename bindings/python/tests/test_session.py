import numpy as np
import pytest

import ssa
from ssa._ssa_cffi import ffi, lib

from conftest import HEAD_DIM, N_KV, N_Q, make_session, random_kv, to_dtype


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_create_reports_config(rt, dtype):
    with make_session(rt, dtype, n_layers=3, model_fingerprint=0xABCDEF) as s:
        c = s.config
        assert (c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim) == (3, N_Q, N_KV, HEAD_DIM)
        assert s.dtype == dtype
        assert c.model_fingerprint == 0xABCDEF
        assert c.pq_subspaces == 16 and c.pq_centroids == 256  # documented defaults
        assert len(s) == 0
        assert not s.device_pointers


def test_create_with_index_options(rt):
    with make_session(rt, pq_subspaces=8, pq_centroids=32, page_tokens=64, index_min_tokens=100,
                      index_regrow_factor=0.0, index_iterations=3) as s:
        c = s.config
        assert (c.pq_subspaces, c.pq_centroids, c.page_tokens) == (8, 32, 64)
        assert (c.index_min_tokens, c.index_regrow_factor, c.index_iterations) == (100, 0.0, 3)


@pytest.mark.parametrize("proxy", ["pq", "opq", "pq4", "opq4", ssa.Proxy.OPQ4, "qpq", "qpq4"])
def test_create_with_proxy_and_weight(rt, rng, proxy):
    four_bit = proxy in ("pq4", "opq4", ssa.Proxy.OPQ4, "qpq4")
    with make_session(rt, n_layers=1, proxy=proxy, pq_subspaces=32 if four_bit else 16, pq_centroids=16,
                      index_min_tokens=100, pq_parallel_weight=4.0) as s:
        c = s.config
        assert c.proxy == ssa.Proxy(proxy if isinstance(proxy, ssa.Proxy) else ssa.Proxy[proxy.upper()])
        assert c.pq_parallel_weight == 4.0
        if proxy in ("qpq", "qpq4"):
            s.observe_queries(0, rng.standard_normal((20, N_Q, HEAD_DIM)).astype(np.float32))
        else:
            with pytest.raises(ssa.InvalidArgument, match="learns nothing from queries"):
                s.observe_queries(0, rng.standard_normal((2, N_Q, HEAD_DIM)).astype(np.float32))
        k, v = random_kv(rng, 300, clusters=4)
        s.append(0, k, v)  # trains the index: score-aware codebooks and codes
        q = rng.standard_normal((N_Q, HEAD_DIM)).astype(np.float32)
        assert np.isfinite(s.decode(0, q, method="ssa", budget=64)).all()


def test_four_bit_proxy_needs_small_codebooks(rt):
    with pytest.raises(ssa.InvalidArgument, match="4-bit"):
        rt.create_session(1, N_Q, N_KV, HEAD_DIM, "float16", proxy="pq4", pq_subspaces=16, pq_centroids=256)
    with pytest.raises(ssa.InvalidArgument, match="pq_parallel_weight"):
        rt.create_session(1, N_Q, N_KV, HEAD_DIM, "float16", pq_parallel_weight=0.5)
    with pytest.raises(ssa.InvalidArgument, match="proxy must be"):
        rt.create_session(1, N_Q, N_KV, HEAD_DIM, "float16", proxy="pq3")


@pytest.mark.parametrize("kw", [dict(head_dim=30), dict(n_q=6, n_kv=4), dict(n_layers=0),
                                dict(head_dim=520), dict(pq_subspaces=5), dict(pq_centroids=300)])
def test_create_rejects_bad_shapes(rt, kw):
    args = dict(n_layers=2, n_q=N_Q, n_kv=N_KV, d=HEAD_DIM)
    rename = {"head_dim": "d"}
    for key, val in kw.items():
        args[rename.get(key, key)] = val
    extra = {k: args.pop(k) for k in list(args) if k.startswith("pq_")}
    with pytest.raises(ssa.InvalidArgument) as ei:
        rt.create_session(args["n_layers"], args["n_q"], args["n_kv"], args["d"], "float16", **extra)
    assert ei.value.status == ssa.Status.INVALID_ARGUMENT
    assert ei.value.function == "ssa_session_create"
    assert ei.value.message  # the library says what is wrong


def test_unknown_dtype(rt):
    with pytest.raises(ValueError, match="dtype"):
        rt.create_session(1, 8, 2, 64, "int8")


def test_dtype_aliases(rt):
    for alias, name in [(np.float16, "float16"), ("f32", "float32"), ("bf16", "bfloat16"),
                        (ssa.DType.FLOAT32, "float32")]:
        with rt.create_session(1, 8, 2, 64, alias) as s:
            assert s.dtype == name


def test_append_grows_layers(rt, rng):
    with make_session(rt, n_layers=3) as s:
        k, v = random_kv(rng, 40)
        s.append(0, k, v)
        s.append(0, k[:10], v[:10])
        s.append(1, k[:25], v[:25])
        assert s.layer_length(0) == 50
        assert s.layer_length(1) == 25
        assert s.layer_length(2) == 0
        assert len(s) == 0  # the minimum over layers
        s.append(2, k[:30], v[:30])
        assert len(s) == 25
        s.append(1, k[:0], v[:0])  # zero tokens: a no-op
        assert s.layer_length(1) == 25


def _last_message():
    return ffi.string(lib.ssa_last_error_message())


def test_append_shape_errors_raise_before_c_call(rt, rng):
    with make_session(rt) as s:
        k, v = random_kv(rng, 20)
        s.append(0, k, v)
        with pytest.raises(ssa.InvalidArgument):
            s.append(9, k, v)  # a library error sets this thread's message
        before = _last_message()
        assert before
        bad = {
            "2-D k": (k.reshape(20, -1), v),
            "wrong heads": (k.reshape(20, 1, 2 * HEAD_DIM), v.reshape(20, 1, 2 * HEAD_DIM)),
            "n differs": (k, v[:19]),
            "dtype": (k.astype(np.float64), v.astype(np.float64)),
            "non-contiguous": (np.ascontiguousarray(k.transpose(1, 0, 2)).transpose(1, 0, 2), v),
            "list": (k.tolist(), v),
        }
        for what, (kk, vv) in bad.items():
            with pytest.raises(ValueError) as ei:
                s.append(0, kk, vv)
            assert isinstance(ei.value, ssa.InvalidArgument), what
            assert ei.value.function is None, what  # raised by the binding, not the library
            assert _last_message() == before, what  # no C call happened
        assert s.layer_length(0) == 20


def test_append_bad_layer_is_library_error(rt, rng):
    with make_session(rt, n_layers=2) as s:
        k, v = random_kv(rng, 4)
        with pytest.raises(ssa.InvalidArgument) as ei:
            s.append(2, k, v)
        assert ei.value.function == "ssa_session_append"
        assert "2" in ei.value.message
        assert s.layer_length(0) == 0


def test_half_dtypes_enforced(rt, rng):
    k, v = random_kv(rng, 8)
    with make_session(rt, "float16") as s:
        with pytest.raises(ValueError, match="float16"):
            s.append(0, k, v)  # float32 into a float16 session: refused, never converted
        s.append(0, to_dtype(k, "float16"), to_dtype(v, "float16"))
        assert s.layer_length(0) == 8
    with make_session(rt, "bfloat16") as s:
        with pytest.raises(ValueError):
            s.append(0, to_dtype(k, "float16"), to_dtype(v, "float16"))
        s.append(0, to_dtype(k, "bfloat16"), to_dtype(v, "bfloat16"))
        assert s.layer_length(0) == 8


def test_closed_session_raises(rt, rng):
    s = make_session(rt)
    s.close()
    assert s.closed
    k, v = random_kv(rng, 2)
    with pytest.raises(ValueError, match="closed"):
        s.append(0, k, v)
    with pytest.raises(ValueError, match="closed"):
        len(s)


def test_session_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        ssa.Session()


def test_update_index_keeps_dense_exact(rt, rng):
    from conftest import random_q, reference_attention, rel_err

    with make_session(rt, n_layers=1) as s:
        k, v = random_kv(rng, 600, clusters=6)
        s.append(0, k, v)
        q = random_q(rng)
        before = s.decode(0, q, method="dense")
        s.update_index()
        after = s.decode(0, q, method="dense")
        assert np.array_equal(before, after)
        assert rel_err(after, reference_attention(q, k, v)) < 1e-5
        pq = s.decode(0, q, method="pq_topk", budget=600)  # budget covers N: exact
        assert rel_err(pq, reference_attention(q, k, v)) < 1e-5


def test_append_async_on_cpu_equals_append(rt, rng):
    # CPU sessions: append_async is append (the stream is not used).
    from conftest import random_q

    k, v = random_kv(rng, 1500, clusters=6)
    q = random_q(rng, scale=1.5)
    chunks = [(0, 600), (600, 1100), (1100, 1500)]  # the index is trained at 512 tokens
    with make_session(rt, index_min_tokens=512) as a, make_session(rt, index_min_tokens=512) as b:
        for layer in range(2):
            for lo, hi in chunks:
                a.append_async(layer, k[lo:hi], v[lo:hi])
                b.append(layer, k[lo:hi], v[lo:hi])
        assert len(a) == len(b) == 1500
        assert a.layer_length(0) == a.layer_length(1) == 1500
        for layer in range(2):
            da, db = a.decode(layer, q, method="dense"), b.decode(layer, q, method="dense")
            assert da.tobytes() == db.tobytes()
            kw = dict(method="ssa", budget=200, n_sink=16, n_local=16, seed=9, step=3)
            sa, sb = a.decode(layer, q, **kw), b.decode(layer, q, **kw)
            assert sa.tobytes() == sb.tobytes()
            assert sa.tobytes() != da.tobytes()  # the SSA decode is sparse here


def test_append_async_errors(rt, rng):
    with make_session(rt, n_layers=2) as s:
        k, v = random_kv(rng, 4)
        with pytest.raises(ssa.InvalidArgument) as ei:
            s.append_async(2, k, v)
        assert ei.value.function == "ssa_session_append_async"
        with pytest.raises(ValueError) as ei:
            s.append_async(0, k, v[:3])  # shapes are checked as in append
        assert ei.value.function is None
        with pytest.raises(ValueError, match="stream"):
            s.append_async(0, k, v, stream=-1)
        bad = k.copy()
        bad[1, 0, 5] = np.nan
        with pytest.raises(ssa.InvalidArgument):
            s.append_async(0, bad, v)  # CPU sessions scan k and v as append does
        assert s.layer_length(0) == 0
