import numpy as np
import pytest

import ssa
from ssa._ssa_cffi import ffi, lib


def test_version_matches_header():
    major, minor, patch = ssa.version()
    assert (major, minor) == ssa.header_version()[:2]
    assert int(lib.ssa_version()) == major * 10000 + minor * 100 + patch


def test_cpu_runtime_properties():
    with ssa.Runtime(backend="cpu", threads=3, seed=9) as rt:
        assert rt.backend == "cpu"
        assert rt.threads == 3
        assert not rt.closed
        assert "cpu" in repr(rt)
    assert rt.closed


def test_default_threads_is_at_least_one():
    with ssa.Runtime(backend="cpu") as rt:
        assert rt.threads >= 1


def test_auto_backend_resolves():
    with ssa.Runtime() as rt:
        assert rt.backend in ("cpu", "cuda")


def test_cuda_request_without_cuda_raises_or_works():
    try:
        rt = ssa.Runtime(backend="cuda")
    except (ssa.Unsupported, ssa.Device) as e:
        assert e.status in (ssa.Status.UNSUPPORTED, ssa.Status.DEVICE)
        assert e.message
        assert e.function == "ssa_runtime_create"
    else:
        with rt:
            assert rt.backend == "cuda"


def test_unknown_backend_name_is_value_error():
    with pytest.raises(ValueError, match="backend"):
        ssa.Runtime(backend="tpu")


def test_negative_threads_rejected():
    with pytest.raises(ssa.InvalidArgument):
        ssa.Runtime(backend="cpu", threads=-1)


def test_unknown_backend_value_rejected_by_library():
    with pytest.raises(ssa.InvalidArgument) as ei:
        ssa.Runtime(backend=17)
    assert ei.value.function == "ssa_runtime_create"
    assert ei.value.message


def test_session_keeps_runtime_alive():
    rt = ssa.Runtime(backend="cpu", threads=1)
    s = rt.create_session(1, 4, 2, 32, "float32")
    rt.close()  # deferred: the session still uses it
    assert rt.closed
    assert rt._ptr != ffi.NULL
    k = np.random.default_rng(1).standard_normal((5, 2, 32)).astype(np.float32)
    s.append(0, k, k + 1)
    assert len(s) == 5
    with pytest.raises(ValueError, match="closed"):
        rt.create_session(1, 4, 2, 32, "float32")
    s.close()
    assert rt._ptr == ffi.NULL  # freed with its last session
    s.close()  # idempotent


def test_dropping_runtime_reference_is_safe():
    s = ssa.Runtime(backend="cpu", threads=1).create_session(1, 4, 2, 32, "float32")
    k = np.random.default_rng(2).standard_normal((3, 2, 32)).astype(np.float32)
    s.append(0, k, k)
    out = s.decode(0, np.ones((4, 32), np.float32) * 0.1, method="dense")
    assert out.shape == (4, 32) and np.isfinite(out).all()
    s.close()


def test_sharded_runtime_decodes_as_unsharded():
    rng = np.random.default_rng(3)
    n, nkv, nq, d = 20000, 2, 4, 64
    k = rng.standard_normal((n, nkv, d)).astype(np.float32)
    v = rng.standard_normal((n, nkv, d)).astype(np.float32)
    q = rng.standard_normal((nq, d)).astype(np.float32)
    with ssa.Runtime(backend="cpu", threads=2, seed=5) as one, \
            ssa.Runtime(backend="cpu", threads=2, seed=5, devices=[4, 0, 9], shard_tokens=8192) as three:
        assert one.shards == 1 and three.shards == 3
        outs = []
        for rt in (one, three):
            with rt.create_session(n_layers=1, n_q_heads=nq, n_kv_heads=nkv, head_dim=d, dtype="float32",
                                   pq_centroids=16) as s:
                s.append(0, k[:9000], v[:9000])
                s.append(0, k[9000:], v[9000:])
                outs.append([s.decode(0, q, method=m, sparsity=20, step=2)
                             for m in ("dense", "pq_topk", "ssa", "ssa_adaptive")])
        for a, b in zip(*outs):
            assert np.array_equal(a, b)


def test_sharded_runtime_bad_options():
    with pytest.raises(ssa.InvalidArgument, match="repeats"):
        ssa.Runtime(backend="cpu", devices=[1, 1])
    with pytest.raises(ssa.InvalidArgument, match="8192"):
        ssa.Runtime(backend="cpu", devices=[0, 1], shard_tokens=1000)
    with pytest.raises(ssa.InvalidArgument, match="n_devices"):
        ssa.Runtime(backend="cpu", devices=[])


def test_options_are_reported_as_given():
    rt = ssa.Runtime(backend="cpu", threads=1, seed=9, device_kv_budget=1 << 30, host_cache_bytes=1 << 27,
                     devices=[4, 7], shard_tokens=16384)
    o = rt.options
    assert o == dict(backend="cpu", threads=1, seed=9, device=0, device_kv_budget=1 << 30,
                     host_cache_bytes=1 << 27, host_pool_bytes=0, devices=(4, 7), shard_tokens=16384)
    assert rt.shards == 2 and rt.device == 0  # CPU shards: the ordinals only name them
    o["threads"] = 5
    assert rt.options["threads"] == 1  # a copy
    assert "devices=[4, 7]" in repr(rt) and "device_kv_budget=1073741824" in repr(rt)
    s = rt.create_session(1, 4, 2, 32, "float32")
    rt.close()
    assert rt.backend == "cpu"  # still known while its sessions live
    s.close()
    assert ssa.Runtime(backend="cpu").options["devices"] is None


def test_host_pool_bytes():
    """host_pool_bytes: checked on every backend (a multiple of 64 MiB, only with a
    budget), ignored by CPU runtimes, whose sessions decode as without it."""
    chunk = 64 << 20
    for bad, words in ((chunk + 1, "multiple of"), (1, "multiple of"), (3 * chunk // 2, "multiple of")):
        with pytest.raises(ssa.InvalidArgument, match=words):
            ssa.Runtime(backend="cpu", device_kv_budget=1 << 30, host_pool_bytes=bad)
    with pytest.raises(ssa.InvalidArgument, match="needs a device_kv_budget"):
        ssa.Runtime(backend="cpu", host_pool_bytes=chunk)
    with pytest.raises(ssa.InvalidArgument, match="host_pool_bytes"):
        ssa.Runtime(backend="cpu", device_kv_budget=1 << 30, host_pool_bytes=-chunk)
    with pytest.raises(ssa.InvalidArgument, match="host_pool_bytes"):
        ssa.Runtime(backend="cpu", device_kv_budget=1 << 30, host_pool_bytes=1 << 64)
    rng = np.random.default_rng(3)
    k = rng.standard_normal((3000, 2, 32)).astype(np.float32)
    v = rng.standard_normal((3000, 2, 32)).astype(np.float32)
    q = rng.standard_normal((4, 32)).astype(np.float32)
    outs = []
    for pool in (0, 1 << 50):  # 1 PiB: a CPU runtime page-locks nothing
        rt = ssa.Runtime(backend="cpu", threads=1, device_kv_budget=1 << 30 if pool else 0, host_pool_bytes=pool)
        assert rt.options["host_pool_bytes"] == pool
        assert ("host_pool_bytes=%d" % pool in repr(rt)) == bool(pool)
        s = rt.create_session(1, 4, 2, 32, "float32")
        s.append(0, k, v)
        outs.append(s.decode(0, q, method="ssa", budget=300, seed=4))
        s.close()
        rt.close()
    assert np.array_equal(outs[0], outs[1])
