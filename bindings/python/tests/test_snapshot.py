"""Snapshot round trips. While the library has no snapshots, save/checkpoint/load must
raise ssa.Unsupported; the round-trip checks run as soon as save succeeds."""
import os

import numpy as np
import pytest

import ssa

from conftest import make_session, random_kv, random_q, reference_attention, rel_err

pytestmark = pytest.mark.snapshot


def _filled(rt, rng, n=1500):
    s = make_session(rt, n_layers=2, model_fingerprint=0x1234_5678_9ABC)
    k, v = random_kv(rng, n, clusters=5)
    s.append(0, k, v)
    s.append(1, k[: n // 2], v[: n // 2])
    return s, k, v


def _save_or_skip(s, path, call="save"):
    try:
        getattr(s, call)(path)
    except ssa.Unsupported as e:
        assert e.status == ssa.Status.UNSUPPORTED
        assert e.function == "ssa_session_" + call
        assert e.message
        assert not os.path.exists(path)
        pytest.skip("this libssa build has no snapshots (ssa.Unsupported raised as documented)")


def test_unsupported_or_working_status(rt, rng, tmp_path):
    s, _, _ = _filled(rt, rng, 100)
    with s:
        path = str(tmp_path / "a.ssa")
        for call in ("save", "checkpoint"):
            try:
                getattr(s, call)(path)
            except ssa.Unsupported as e:
                assert e.message
            else:
                assert os.path.getsize(path) > 0
        try:
            rt.load(str(tmp_path / "missing.ssa")).close()
            raise AssertionError("loading a missing file succeeded")
        except (ssa.IOError, ssa.Unsupported) as e:
            assert e.function == "ssa_session_load"


@pytest.mark.parametrize("verify,mmap", [(False, False), (True, False), (False, True)])
def test_save_load_round_trip(rt, rng, tmp_path, verify, mmap):
    s, k, v = _filled(rt, rng)
    path = tmp_path / "s.ssa"  # os.PathLike accepted
    with s:
        _save_or_skip(s, path)
        q = random_q(rng, scale=1.5)
        with rt.load(path, verify=verify, mmap=mmap) as t:
            assert t.config == s.config
            assert len(t) == len(s) and t.layer_length(0) == s.layer_length(0)
            for method in ("dense", "pq_topk", "ssa", "ssa_adaptive", "sampling"):
                kw = dict(method=method, budget=200, n_sink=16, n_local=16, seed=5, step=9)
                assert np.array_equal(t.decode(0, q, **kw), s.decode(0, q, **kw)), method
            assert rel_err(t.decode(1, q, method="dense"), reference_attention(q, k[:750], v[:750])) < 1e-5
            k2, v2 = random_kv(rng, 10)
            t.append(1, k2, v2)  # a restored session keeps growing
            assert t.layer_length(1) == 760


def test_checkpoint_then_continue(rt, rng, tmp_path):
    s, k, v = _filled(rt, rng)
    path = str(tmp_path / "c.ssa")
    with s:
        _save_or_skip(s, path, "checkpoint")
        k2, v2 = random_kv(rng, 400)
        s.append(0, k2, v2)
        s.checkpoint(path)
        q = random_q(rng)
        with rt.load(path, verify=True) as t:
            assert t.layer_length(0) == 1900
            kw = dict(method="ssa", budget=150, n_sink=16, n_local=16, seed=2, step=4)
            assert np.array_equal(t.decode(0, q, **kw), s.decode(0, q, **kw))


def test_inspect_describes_without_loading(rt, rng, tmp_path):
    s, _, _ = _filled(rt, rng)
    path = tmp_path / "i.ssa"
    with s:
        _save_or_skip(s, path)
        info = ssa.inspect(path)
        c = s.config
        assert (info.n_layers, info.n_q_heads, info.n_kv_heads, info.head_dim, info.dtype) == \
            (c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim, c.dtype)
        assert (info.pq_subspaces, info.pq_centroids, info.page_tokens) == (c.pq_subspaces, c.pq_centroids, c.page_tokens)
        assert info.model_fingerprint == 0x1234_5678_9ABC
        assert (info.proxy, info.pq_parallel_weight) == (c.proxy, c.pq_parallel_weight)
        assert (info.length, info.max_layer_length, info.generation) == (750, 1500, 1)
        assert 0 < info.live_bytes <= info.file_bytes <= os.path.getsize(path)
        k2, v2 = random_kv(rng, 300)
        s.append(1, k2, v2)
        s.checkpoint(path)
        again = ssa.inspect(path)
        assert (again.length, again.generation) == (1050, 2)
    with pytest.raises(ssa.IOError):
        ssa.inspect(tmp_path / "missing.ssa")
    junk = tmp_path / "junk.ssa"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises((ssa.Corrupt, ssa.Version)):
        ssa.inspect(junk)


def test_corrupt_and_truncated_files(rt, rng, tmp_path):
    s, _, _ = _filled(rt, rng, 600)
    path = str(tmp_path / "x.ssa")
    with s:
        _save_or_skip(s, path)
    data = bytearray(open(path, "rb").read())
    flipped = tmp_path / "flipped.ssa"
    data2 = bytearray(data)
    data2[len(data2) // 2] ^= 0x5A
    flipped.write_bytes(bytes(data2))
    with pytest.raises((ssa.Corrupt, ssa.Version)):
        rt.load(str(flipped), verify=True).close()
    cut = tmp_path / "cut.ssa"
    cut.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ssa.Corrupt):
        rt.load(str(cut)).close()
    junk = tmp_path / "junk.ssa"
    junk.write_bytes(os.urandom(4096) + b"not a snapshot")
    with pytest.raises((ssa.Corrupt, ssa.Version)):
        rt.load(str(junk)).close()


def test_path_validation(rt, rng):
    s, _, _ = _filled(rt, rng, 20)
    with s:
        with pytest.raises(ValueError, match="NUL"):
            s.save("a\0b")
        with pytest.raises(ValueError, match="path"):
            s.save(12)
