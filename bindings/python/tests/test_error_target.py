"""Error-targeted decode from Python: per-head errors against a float64 reference,
budgets that grow as the target tightens, the cap, reproducibility, bad values."""
import math

import numpy as np
import pytest

import ssa

from conftest import N_Q, make_session, random_kv, random_q, reference_attention, to_f64

N = 6000


def _session(rt, rng):
    s = make_session(rt, n_layers=1)
    k, v = random_kv(rng, N, clusters=24)
    s.append(0, k, v)
    q = random_q(rng, scale=3.0)
    return s, q, reference_attention(q, k, v)


def _head_errors(out, ref):
    out = to_f64(out)
    return np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1)


@pytest.mark.parametrize("method", ["ssa", "ssa_adaptive"])
def test_target_met_and_budget_grows(rt, rng, method):
    s, q, ref = _session(rt, rng)
    with s:
        prev_budget = 0
        for eps in (0.3, 0.15, 0.07):
            errs, budget, read = [], 0, 0
            for step in range(8):
                out, st = s.decode(0, q, method=method, n_sink=16, n_local=32, seed=3, step=step,
                                   target_error=eps, target_delta=0.1, max_budget=N, stats=True)
                errs.extend(_head_errors(out, ref))
                budget += st.target_budget
                read += st.tokens_read
                assert st.capped_heads == 0
                assert read <= budget
            within = np.mean(np.array(errs) <= eps)
            # 64 decodes at delta = 0.1: three binomial standard deviations below 0.9
            assert within >= 0.9 - 3 * math.sqrt(0.09 / len(errs)), (eps, within)
            assert budget > 1.2 * prev_budget
            prev_budget = budget
        assert prev_budget < 8 * N_Q * N / 3  # sparse even at the tightest target


def test_cap_is_honoured_and_reported(rt, rng):
    s, q, _ = _session(rt, rng)
    with s:
        out, st = s.decode(0, q, n_sink=16, n_local=32, target_error=0.001, max_budget=300, stats=True)
        assert st.capped_heads == N_Q
        assert st.target_budget <= N_Q * 300
        assert st.tokens_read <= N_Q * 300
        assert st.predicted_error / N_Q > 0.001
        assert np.isfinite(out).all()


def test_reproducible_for_seed_and_step(rt, rng):
    s, q, _ = _session(rt, rng)
    with s:
        kw = dict(method="ssa_adaptive", n_sink=16, n_local=32, seed=9, target_error=0.1)
        a = s.decode(0, q, step=4, **kw)
        b = s.decode(0, q, step=4, **kw)
        c = s.decode(0, q, step=5, **kw)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        # the batch call takes the same options and gives the same result
        (d,) = rt.decode_batch([(s, q)], 0, step=4, **kw)
        np.testing.assert_array_equal(a, d)


@pytest.mark.parametrize("kw, needle", [
    (dict(target_error=-0.1), "target_error"),
    (dict(target_error=float("nan")), "target_error"),
    (dict(target_error=float("inf")), "target_error"),
    (dict(target_error=0.1, target_delta=0.0), "target_delta"),
    (dict(target_error=0.1, target_delta=1.0), "target_delta"),
    (dict(target_error=0.1, target_delta=float("nan")), "target_delta"),
    (dict(target_error=0.1, method="pq_topk"), "SSA or SSA_ADAPTIVE"),
    (dict(target_error=0.1, method="dense"), "SSA or SSA_ADAPTIVE"),
    (dict(target_error=0.1, heavy_fraction=1.0), "heavy_fraction"),
    (dict(target_error=0.1, budget=500, max_budget=400), "max_budget"),
])
def test_bad_values_are_rejected(rt, rng, kw, needle):
    s, q, _ = _session(rt, rng)
    with s:
        out = np.full_like(q, 5.0)
        with pytest.raises(ssa.InvalidArgument, match=needle):
            s.decode(0, q, out=out, **kw)
        assert (out == 5.0).all()
    with pytest.raises(ssa.InvalidArgument):
        s2, _, _ = _session(rt, rng)
        with s2:
            s2.decode(0, q, max_budget=-1, target_error=0.1)
