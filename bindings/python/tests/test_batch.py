import numpy as np
import pytest

import ssa

from conftest import make_session, random_kv, random_q, reference_attention, rel_err


def test_batch_matches_single_decodes(rt, rng):
    shapes = [(8, 2, 64, 300), (4, 4, 32, 1200), (8, 1, 64, 77)]
    sessions, data = [], []
    for n_q, n_kv, d, n in shapes:
        s = rt.create_session(1, n_q, n_kv, d, "float32")
        k, v = random_kv(rng, n, n_kv=n_kv, d=d)
        s.append(0, k, v)
        sessions.append(s)
        data.append((k, v, random_q(rng, n_q=n_q, d=d, scale=1.5)))
    try:
        items = [(s, q) for s, (_, _, q) in zip(sessions, data)]
        outs = rt.decode_batch(items, 0, method="dense")
        for out, (k, v, q) in zip(outs, data):
            assert rel_err(out, reference_attention(q, k, v)) < 1e-5
        kw = dict(method="ssa", budget=64, n_sink=8, n_local=8, seed=9, step=2)
        outs = rt.decode_batch(items + [items[1]], 0, **kw)
        assert len(outs) == 4
        for out, (s, q) in zip(outs, items + [items[1]]):
            assert np.array_equal(out, s.decode(0, q, **kw))
    finally:
        for s in sessions:
            s.close()


def test_batch_writes_given_outputs(rt, rng):
    with make_session(rt, n_layers=2) as s:
        k, v = random_kv(rng, 150)
        s.append(1, k, v)
        q1, q2 = random_q(rng), random_q(rng)
        o1, o2 = np.empty_like(q1), np.empty_like(q2)
        res = rt.decode_batch([(s, q1, o1), (s, q2, o2)], 1, method="dense")
        assert res[0] is o1 and res[1] is o2
        assert rel_err(o1, reference_attention(q1, k, v)) < 1e-5
        assert rel_err(o2, reference_attention(q2, k, v)) < 1e-5


def test_batch_errors(rt, rng):
    with make_session(rt, n_layers=1) as s, ssa.Runtime(backend="cpu", threads=1) as other:
        k, v = random_kv(rng, 10)
        s.append(0, k, v)
        q = random_q(rng)
        with other.create_session(1, 8, 2, 64, "float32") as s2:
            s2.append(0, k, v)
            with pytest.raises(ValueError, match="another runtime"):
                rt.decode_batch([(s, q), (s2, q)], 0)
        with pytest.raises(ValueError, match=r"items\[1\] q has shape"):
            rt.decode_batch([(s, q), (s, q[:2])], 0)
        with pytest.raises(ValueError, match=r"items\[0\]"):
            rt.decode_batch([s], 0)
        with pytest.raises(ssa.InvalidArgument) as ei:
            rt.decode_batch([(s, q)], 3)  # layer out of range: the library's check
        assert ei.value.function == "ssa_decode_batch"
