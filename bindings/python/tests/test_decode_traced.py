"""Session.decode_traced: the output of decode(), and each head's rows are the
rows its output used (the float64 Horvitz-Thompson estimator over them matches)."""
import numpy as np
import pytest

import ssa

from conftest import HEAD_DIM, N_KV, N_Q, make_session, random_kv, random_q, rel_err, to_f64


def ht_reference(q, k, v, rows, log_pi):
    """sum_t exp(s_t) v_t / pi_t / sum_t exp(s_t) / pi_t over the listed rows, float64."""
    q, k, v = to_f64(q), to_f64(k), to_f64(v)
    s = k[rows] @ q / np.sqrt(q.shape[-1]) - log_pi.astype(np.float64)
    w = np.exp(s - s.max())
    return (w / w.sum()) @ v[rows]


@pytest.mark.parametrize("group", ["off", "mixture", "mean_query"])
@pytest.mark.parametrize("method", ["dense", "pq_topk", "ssa", "ssa_adaptive"])
def test_trace_rows_are_the_rows_used(rt, rng, method, group):
    n = 5000
    with make_session(rt, "float32") as s:
        k, v = random_kv(rng, n, clusters=40)
        s.append(0, k, v)
        q = random_q(rng, scale=3.0)
        kw = dict(method=method, sparsity=20, n_sink=16, n_local=32, seed=7, step=3, group_selection=group)
        ref, ref_st = s.decode(0, q, stats=True, **kw)
        out, st, tr = s.decode_traced(0, q, log_pi=True, **kw)
        assert np.array_equal(out, ref) and st == ref_st
        assert len(tr) == N_Q and int(tr.offsets[-1]) == st.tokens_read
        g = N_Q // N_KV
        for h in range(N_Q):
            rows = tr.head(h)
            assert np.all(np.diff(rows.astype(np.int64)) > 0)
            if method == "dense":
                assert len(rows) == n
            else:
                assert list(rows[:16]) == list(range(16)) and list(rows[-32:]) == list(range(n - 32, n))
                if group != "off":
                    assert np.array_equal(rows, tr.head(h // g * g))
            lp = tr.log_pi[int(tr.offsets[h]):int(tr.offsets[h + 1])]
            want = ht_reference(q[h], k[:, h // g], v[:, h // g], rows.astype(np.int64), lp)
            assert rel_err(out[h], want) < 1e-5


def test_trace_without_log_pi_and_bad_layer(rt, rng):
    with make_session(rt, "float32") as s:
        k, v = random_kv(rng, 3000)
        s.append(0, k, v)
        _, st, tr = s.decode_traced(0, random_q(rng), sparsity=10, n_sink=8, n_local=8)
        assert tr.log_pi is None and tr.tokens.dtype == np.uint32 and int(tr.offsets[-1]) == st.tokens_read
        with pytest.raises(ssa.InvalidArgument):
            tr.head(N_Q)
        with pytest.raises(ssa.InvalidArgument):
            s.decode_traced(5, random_q(rng))
