import threading

import numpy as np
import pytest

import ssa

from conftest import (HEAD_DIM, N_Q, make_session, random_kv, random_q, reference_attention, rel_err,
                      to_dtype)

SPARSE = ["oracle_topk", "pq_topk", "hybrid_uniform", "sampling", "ssa", "ssa_adaptive"]
SAMPLED = ["hybrid_uniform", "sampling", "ssa", "ssa_adaptive"]
# Tolerance of the output against the float64 reference: the inputs are rounded to the
# session dtype before the reference sees them, so this is only the output's rounding
# plus accumulation error.
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dense_matches_float64_reference(rt, rng, dtype):
    with make_session(rt, dtype, n_layers=2) as s:
        k0, v0 = random_kv(rng, 700)
        k1, v1 = random_kv(rng, 333)
        k0, v0, k1, v1 = (to_dtype(a, dtype) for a in (k0, v0, k1, v1))
        s.append(0, k0[:300], v0[:300])
        s.append(1, k1, v1)
        s.append(0, k0[300:], v0[300:])
        q = to_dtype(random_q(rng, scale=2.0), dtype)
        out0, st = s.decode(0, q, method="dense", stats=True)
        out1 = s.decode(1, q, method="dense")
        assert out0.dtype == q.dtype and out0.shape == (N_Q, HEAD_DIM)
        assert rel_err(out0, reference_attention(q, k0, v0)) < TOL[dtype]
        assert rel_err(out1, reference_attention(q, k1, v1)) < TOL[dtype]
        # the two layers really are different data
        assert rel_err(out0, reference_attention(q, k1, v1)) > 0.1
        assert st.context_tokens == 700
        assert st.tokens_read == N_Q * 700


def test_gqa_head_mapping(rt, rng):
    """Each q head must read kv head h // (n_q / n_kv), not some other mapping."""
    with make_session(rt, n_q=8, n_kv=4, n_layers=1) as s:
        k, v = random_kv(rng, 200, n_kv=4)
        s.append(0, k, v)
        q = random_q(rng, n_q=8, scale=3.0)
        out = s.decode(0, q, method="dense")
        ref = reference_attention(q, k, v)
        for h in range(8):
            assert np.linalg.norm(out[h] - ref[h]) / np.linalg.norm(ref[h]) < 1e-5, h


@pytest.mark.parametrize("method", ["dense"] + SPARSE)
def test_budget_covering_context_is_dense(rt, rng, method):
    with make_session(rt, n_layers=1) as s:
        k, v = random_kv(rng, 900, clusters=5)
        s.append(0, k, v)
        q = random_q(rng, scale=2.0)
        dense = s.decode(0, q, method="dense")
        for budget in (900, 5000):
            out = s.decode(0, q, method=method, budget=budget, n_sink=16, n_local=16, seed=5, step=3)
            assert rel_err(out, reference_attention(q, k, v)) < 1e-5
            np.testing.assert_allclose(out, dense, rtol=1e-5, atol=1e-6)


def _peaked_session(rt, rng, n=4096):
    s = make_session(rt, n_layers=1)
    k, v = random_kv(rng, n, clusters=8)
    s.append(0, k, v)
    # a query aligned with one cluster's keys: attention concentrates there
    q = (k[17].repeat(N_Q // 2, axis=0) * 0.6 + 0.2 * random_q(rng)).astype(np.float32)
    return s, k, v, q


@pytest.mark.parametrize("method", SPARSE)
def test_sparse_methods_read_fewer_tokens(rt, rng, method):
    s, k, v, q = _peaked_session(rt, rng)
    with s:
        budget = 512
        out, st = s.decode(0, q, method=method, budget=budget, n_sink=32, n_local=32, seed=11, stats=True)
        assert np.isfinite(out).all()
        assert st.context_tokens == 4096
        assert 0 < st.tokens_read <= N_Q * budget
        assert st.tokens_read < N_Q * 4096
        if method in SAMPLED:
            assert st.draws > 0
            assert 0 < st.unique_samples <= st.draws
        if method in ("oracle_topk", "pq_topk"):
            assert st.draws == 0
            assert st.heavy_tokens == N_Q * (budget - 64)  # k' = budget - n_sink - n_local
            assert rel_err(out, reference_attention(q, k, v)) < 0.3


def oracle_topk_reference(q, k, v, budget, n_sink, n_local):
    """Sink + local + the top-k' middle tokens by exact score, then exact softmax over them."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n_q, d = q.shape
    n = k.shape[0]
    group = n_q // k.shape[1]
    out = np.empty((n_q, d))
    for h in range(n_q):
        kh = h // group
        s = k[:, kh, :] @ q[h] / np.sqrt(d)
        middle = np.arange(n_sink, n - n_local)
        top = middle[np.argsort(-s[middle])[: budget - n_sink - n_local]]
        idx = np.concatenate([np.arange(n_sink), np.arange(n - n_local, n), top])
        w = np.exp(s[idx] - s[idx].max())
        out[h] = (w / w.sum()) @ v[idx, kh, :]
    return out


def test_oracle_topk_matches_numpy_oracle(rt, rng):
    s, k, v, q = _peaked_session(rt, rng)
    with s:
        for budget, n_sink, n_local in ((512, 32, 32), (300, 0, 100), (1000, 128, 128)):
            out = s.decode(0, q, method="oracle_topk", budget=budget, n_sink=n_sink, n_local=n_local)
            ref = oracle_topk_reference(q, k, v, budget, n_sink, n_local)
            assert rel_err(out, ref) < 1e-5, (budget, n_sink, n_local)
            if budget <= 512:
                assert rel_err(out, reference_attention(q, k, v)) > 1e-3  # really sparse


def test_sampled_methods_average_out_and_rank(rt, rng):
    """Independent draws per step: averaging 16 steps shrinks the error about 4x (an
    unbiased-style estimator), and at equal budget proxy-proportional sampling beats
    uniform sampling while stratification beats plain sampling (docs/ALGORITHM.md #stratification)."""
    s, k, v, q = _peaked_session(rt, rng)
    with s:
        ref = reference_attention(q, k, v)
        single = {}
        for method in SAMPLED:
            outs = [s.decode(0, q, method=method, budget=512, n_sink=32, n_local=32, seed=11, step=i)
                    .astype(np.float64) for i in range(16)]
            single[method] = np.mean([rel_err(o, ref) for o in outs])
            averaged = rel_err(np.mean(outs, axis=0), ref)
            assert averaged < 0.45 * single[method], (method, averaged, single[method])
        assert single["ssa"] < single["sampling"] < single["hybrid_uniform"], single
        assert single["ssa_adaptive"] < single["sampling"], single


def test_sparsity_sets_budget(rt, rng):
    s, k, v, q = _peaked_session(rt, rng)
    with s:
        _, st10 = s.decode(0, q, method="oracle_topk", sparsity=10, n_sink=16, n_local=16, stats=True)
        _, st40 = s.decode(0, q, method="oracle_topk", sparsity=40, n_sink=16, n_local=16, stats=True)
        assert st10.tokens_read <= N_Q * int(np.ceil(4096 / 10))
        assert st40.tokens_read <= N_Q * int(np.ceil(4096 / 40))
        assert st40.tokens_read < st10.tokens_read


@pytest.mark.parametrize("method", SAMPLED)
def test_seed_and_step_reproducible(rt, rng, method):
    s, k, v, q = _peaked_session(rt, rng)
    with s:
        kw = dict(method=method, budget=300, n_sink=8, n_local=8)
        a = s.decode(0, q, seed=42, step=7, **kw)
        b = s.decode(0, q, seed=42, step=7, **kw)
        assert np.array_equal(a, b)
        c = s.decode(0, q, seed=42, step=8, **kw)
        d = s.decode(0, q, seed=43, step=7, **kw)
        assert not np.array_equal(a, c)  # another step draws other samples
        assert not np.array_equal(a, d)


def test_default_seed_is_runtime_seed(rng):
    with ssa.Runtime(backend="cpu", threads=2, seed=777) as rt:
        s, k, v, q = _peaked_session(rt, rng)
        with s:
            kw = dict(method="sampling", budget=300, n_sink=8, n_local=8, step=1)
            assert np.array_equal(s.decode(0, q, **kw), s.decode(0, q, seed=777, **kw))
            assert not np.array_equal(s.decode(0, q, **kw), s.decode(0, q, seed=778, **kw))


def test_out_parameter_is_written_in_place(rt, rng):
    with make_session(rt, n_layers=1) as s:
        k, v = random_kv(rng, 100)
        s.append(0, k, v)
        q = random_q(rng)
        out = np.full((N_Q, HEAD_DIM), np.nan, dtype=np.float32)
        got = s.decode(0, q, method="dense", out=out)
        assert got is out
        assert rel_err(out, reference_attention(q, k, v)) < 1e-5


def test_decode_argument_errors(rt, rng):
    with make_session(rt, n_layers=1) as s:
        q = random_q(rng)
        with pytest.raises(ssa.InvalidArgument) as ei:
            s.decode(0, q, method="dense")  # empty layer
        assert ei.value.function == "ssa_decode"
        k, v = random_kv(rng, 50)
        s.append(0, k, v)
        with pytest.raises(ValueError, match="q has shape"):
            s.decode(0, q[:4])
        with pytest.raises(ValueError, match="dtype"):
            s.decode(0, q.astype(np.float16))
        with pytest.raises(ValueError, match="overlap"):
            s.decode(0, q, out=q)
        with pytest.raises(ValueError, match="read-only"):
            ro = np.empty_like(q)
            ro.flags.writeable = False
            s.decode(0, q, out=ro)
        with pytest.raises(ValueError, match="contiguous"):
            s.decode(0, np.asfortranarray(q))
        with pytest.raises(ValueError, match="method"):
            s.decode(0, q, method="magic")
        with pytest.raises(ValueError, match="budget"):
            s.decode(0, q, budget=-3)
        for bad in (dict(sparsity=0.5), dict(heavy_fraction=1.5), dict(pi_min=0.0), dict(method=99)):
            with pytest.raises(ssa.InvalidArgument) as ei:
                s.decode(0, q, **bad)
            assert ei.value.function == "ssa_decode", bad
        with pytest.raises(ssa.InvalidArgument):
            s.decode(1, q)


def test_concurrent_decodes_match_serial(rt, rng):
    s, k, v, q = _peaked_session(rt, rng, n=2048)
    with s:
        qs = [random_q(rng, scale=1.5) for _ in range(8)]
        serial = [s.decode(0, qi, method="ssa", budget=256, n_sink=16, n_local=16, seed=3, step=i)
                  for i, qi in enumerate(qs)]
        results = [None] * len(qs)

        def work(i):
            results[i] = s.decode(0, qs[i], method="ssa", budget=256, n_sink=16, n_local=16, seed=3, step=i)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(qs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for a, b in zip(serial, results):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("group", ["mixture", "mean_query", ssa.GroupSelection.MIXTURE])
def test_group_selection_shares_rows_and_is_dense_at_full_budget(rt, rng, group):
    with make_session(rt, "float32") as s:
        n = 3000
        k, v = random_kv(rng, n)
        s.append(0, k, v)
        q = random_q(rng, scale=2.0)
        dense = s.decode(0, q, method="dense")
        for m in ["pq_topk", "ssa", "sampling"]:
            assert rel_err(s.decode(0, q, method=m, budget=n, group_selection=group), dense) < 1e-6
            _, st = s.decode(0, q, method=m, budget=300, n_sink=16, n_local=16, group_selection=group,
                             stats=True)
            g = N_Q // 2  # conftest's sessions have 2 KV heads
            assert st.tokens_read <= N_Q * (32 + g * (300 - 32))
            if m == "pq_topk":
                assert st.heavy_tokens == N_Q * g * (300 - 32)
    with make_session(rt, "float32") as s:
        s.append(0, *random_kv(rng, 500))
        with pytest.raises(ssa.InvalidArgument, match="group_selection"):
            s.decode(0, random_q(rng), group_selection="sideways")
        with pytest.raises(ssa.Unsupported, match="group_selection"):
            s.decode(0, random_q(rng), group_selection="mixture", target_error=0.05)
