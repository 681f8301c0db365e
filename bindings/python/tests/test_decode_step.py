"""Session.decode_step: one native call per layer and token, exactly append +
decode at RNG step `step + position` (CPU sessions run it eagerly; CUDA ones
after reserve() run it on the device)."""
import numpy as np
import pytest

import ssa

from conftest import make_session, random_kv, random_q


@pytest.mark.parametrize("method", ["ssa", "pq_topk", "dense", "ssa_adaptive"])
def test_decode_step_is_append_then_decode(rt, rng, method):
    with make_session(rt, n_layers=2) as a, make_session(rt, n_layers=2) as b:
        k, v = random_kv(rng, 600, clusters=4)
        for s in (a, b):
            s.append(0, k, v)
            s.append(1, k[:300], v[:300])
        b.prefetch(50)  # CPU: nothing to move (no device tier)
        a.reserve(50)  # CPU: reserves nothing, the steps run eagerly
        k2, v2 = random_kv(rng, 20)
        for t in range(20):
            for layer in (0, 1):
                q = random_q(rng)
                position = b.layer_length(layer)
                got, st = a.decode_step(layer, k2[t], v2[t], q, method=method, budget=64, n_sink=8,
                                        n_local=8, seed=3, step=100, stats=True)
                b.append(layer, k2[t:t + 1], v2[t:t + 1])
                want = b.decode(layer, q, method=method, budget=64, n_sink=8, n_local=8, seed=3,
                                step=100 + position)
                assert np.array_equal(got, want)
                assert st.context_tokens == position + 1
        assert a.sync() == 0
        assert a.layer_length(0) == 620 and a.layer_length(1) == 320


def test_decode_step_refuses_bad_shapes(rt, rng):
    with make_session(rt) as s:
        k, v = random_kv(rng, 100)
        s.append(0, k, v)
        with pytest.raises(ssa.InvalidArgument):
            s.decode_step(0, k[:2], v[:2], random_q(rng))  # two tokens
        with pytest.raises(ssa.InvalidArgument):
            s.reserve(0)
        with pytest.raises(ssa.InvalidArgument):
            s.prefetch(-1)
        with pytest.raises(ssa.InvalidArgument):
            s.prefetch(1 << 40)  # beyond the tokens a layer may hold
        assert s.layer_length(0) == 100


@pytest.mark.parametrize("method", ["ssa", "dense"])
def test_decode_step_batch_is_each_session_stepped(rt, rng, method):
    # Sessions of different lengths in one call: each appended and decoded at its own
    # position, as its own decode_step would.
    lens = (700, 130, 401)
    kv = [random_kv(rng, n, clusters=3) for n in lens]
    batch = [make_session(rt) for _ in lens]
    alone = [make_session(rt) for _ in lens]
    try:
        for (k, v), a, b in zip(kv, batch, alone):
            a.append(0, k, v)
            b.append(0, k, v)
        kw = dict(method=method, budget=48, n_sink=8, n_local=16, seed=5, step=7)
        for t in range(6):
            new = [random_kv(rng, 1) for _ in lens]
            qs = [random_q(rng) for _ in lens]
            outs, st = rt.decode_step_batch([(a, k[0], v[0], q) for a, (k, v), q in zip(batch, new, qs)], 0,
                                            stats=True, **kw)
            for b, (k, v), q, got in zip(alone, new, qs, outs):
                assert np.array_equal(got, b.decode_step(0, k[0], v[0], q, **kw))
            assert st.context_tokens == sum(n + t + 1 for n in lens)
        assert [s.layer_length(0) for s in batch] == [n + 6 for n in lens]
        with pytest.raises(ssa.InvalidArgument, match="items\\[1\\]"):
            rt.decode_step_batch([(batch[0], k[0], v[0], q), (batch[1], k[0], v[0])], 0)
        assert [s.layer_length(0) for s in batch] == [n + 6 for n in lens]  # the refused call changed nothing
    finally:
        for s in batch + alone:
            s.close()
