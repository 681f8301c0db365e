import numpy as np
import pytest

import ssa

from conftest import make_session, random_kv, random_q, reference_attention, rel_err


def test_fork_is_independent(rt, rng):
    with make_session(rt, n_layers=2) as s:
        k, v = random_kv(rng, 500, clusters=4)
        s.append(0, k, v)
        s.append(1, k[:200], v[:200])
        q = random_q(rng, scale=2.0)
        before = s.decode(0, q, method="dense")
        before_ssa = s.decode(0, q, method="ssa", budget=100, n_sink=8, n_local=8, seed=4, step=1)
        with s.fork() as f:
            assert len(f) == len(s) == 200
            assert f.layer_length(0) == 500
            # the fork decodes the same as its source (sampling included)
            assert np.array_equal(f.decode(0, q, method="ssa", budget=100, n_sink=8, n_local=8, seed=4,
                                           step=1), before_ssa)
            k2, v2 = random_kv(rng, 300)
            f.append(0, k2, v2)
            f.truncate(100)
            f.append(0, k2[:50], v2[:50])
            assert f.layer_length(0) == 150
            ref_f = reference_attention(q, np.concatenate([k[:100], k2[:50]]), np.concatenate([v[:100], v2[:50]]))
            assert rel_err(f.decode(0, q, method="dense"), ref_f) < 1e-5
            # the source did not move
            assert s.layer_length(0) == 500 and s.layer_length(1) == 200
            assert np.array_equal(s.decode(0, q, method="dense"), before)
            # and mutating the source leaves the fork alone
            s.append(1, k[200:260], v[200:260])
            assert f.layer_length(1) == 100  # truncated in the fork, source grew
        assert s.layer_length(1) == 260
        assert np.array_equal(s.decode(0, q, method="dense"), before)


def test_fork_outlives_source(rt, rng):
    s = make_session(rt, n_layers=1)
    k, v = random_kv(rng, 300)
    s.append(0, k, v)
    f = s.fork()
    s.close()
    q = random_q(rng)
    assert rel_err(f.decode(0, q, method="dense"), reference_attention(q, k, v)) < 1e-5
    f.close()


def test_truncate_equals_fresh_prefix(rt, rng):
    k, v = random_kv(rng, 3000, clusters=6)
    q = random_q(rng, scale=1.5)
    with make_session(rt, n_layers=2) as s, make_session(rt, n_layers=2) as fresh:
        for layer in range(2):
            s.append(layer, k[:1000], v[:1000])
            s.append(layer, k[1000:], v[1000:])
            fresh.append(layer, k[:1700], v[:1700])
        s.truncate(1700)
        assert len(s) == 1700
        for layer in range(2):
            assert np.array_equal(s.decode(layer, q, method="dense"), fresh.decode(layer, q, method="dense"))
            assert rel_err(s.decode(layer, q, method="dense"), reference_attention(q, k[:1700], v[:1700])) < 1e-5
        # appending after truncation continues from the prefix
        s.append(0, k[2500:], v[2500:])
        fresh.append(0, k[2500:], v[2500:])
        assert np.array_equal(s.decode(0, q, method="dense"), fresh.decode(0, q, method="dense"))


def test_truncate_rules(rt, rng):
    with make_session(rt, n_layers=2) as s:
        k, v = random_kv(rng, 100)
        s.append(0, k, v)
        s.append(1, k[:40], v[:40])
        with pytest.raises(ssa.InvalidArgument) as ei:
            s.truncate(41)  # beyond len(s)
        assert ei.value.function == "ssa_session_truncate"
        assert s.layer_length(0) == 100  # all-or-nothing
        s.truncate(40)
        assert s.layer_length(0) == 40 and s.layer_length(1) == 40
        s.truncate(0)
        assert len(s) == 0
        with pytest.raises(ValueError):
            s.truncate(-1)
