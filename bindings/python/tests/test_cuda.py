"""CUDA sessions from Python: torch tensors in and out by device pointer, checked
against the CPU backend on the same data. Skipped without torch or a CUDA device."""
import numpy as np
import pytest

import ssa

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _cpu_reference(k, v, q, method, **kw):
    with ssa.Runtime(backend="cpu", threads=2) as rt:
        with rt.create_session(n_layers=1, n_q_heads=8, n_kv_heads=2, head_dim=64,
                               dtype="float16") as s:
            s.append(0, k, v)
            return s.decode(0, q, method=method, **kw)


def test_dense_from_torch_tensors_matches_cpu_backend():
    rng = np.random.default_rng(3)
    n = 5000
    k = rng.standard_normal((n, 2, 64)).astype(np.float16)
    v = rng.standard_normal((n, 2, 64)).astype(np.float16)
    q = (2 * rng.standard_normal((8, 64))).astype(np.float16)
    want = _cpu_reference(k, v, q, "dense").astype(np.float32)
    with ssa.Runtime(backend="cuda") as rt:
        assert rt.backend == "cuda"
        with rt.create_session(n_layers=1, n_q_heads=8, n_kv_heads=2, head_dim=64,
                               dtype="float16") as s:
            s.append(0, torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda())
            out = torch.empty((8, 64), dtype=torch.float16, device="cuda")
            s.decode(0, torch.from_numpy(q).cuda(), method="dense", out=out)
            torch.cuda.synchronize()
            got = out.float().cpu().numpy()
            rel = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert rel < 2e-3
            # A sparse method runs on device memory too; budget >= N is exactly dense.
            out2 = torch.empty_like(out)
            s.decode(0, torch.from_numpy(q).cuda(), method="ssa", budget=n, out=out2)
            torch.cuda.synchronize()
            assert torch.equal(out, out2)
            # Host arrays without host_pointers are refused with a clear error.
            with pytest.raises(ssa.Error):
                s.append(0, k, v)


def test_append_async_on_a_torch_stream_equals_append():
    # Device tensors appended on a torch stream that a sleep kernel keeps busy, so
    # the copies are still queued when append_async returns; decodes on that
    # stream must read exactly what the plain appends stored.
    rng = np.random.default_rng(11)
    n = 6000
    k = torch.from_numpy(rng.standard_normal((n, 2, 64)).astype(np.float16)).cuda()
    v = torch.from_numpy(rng.standard_normal((n, 2, 64)).astype(np.float16)).cuda()
    q = torch.from_numpy((2 * rng.standard_normal((8, 64))).astype(np.float16)).cuda()
    # The index trains once in the first chunk (a synchronous append); regrow 0
    # keeps the later chunks on the queued path.
    chunks = [(0, 2500), (2500, 2501), (2501, 4100), (4100, n)]
    stream = torch.cuda.Stream()
    with ssa.Runtime(backend="cuda") as rt:
        cfg = dict(n_layers=1, n_q_heads=8, n_kv_heads=2, head_dim=64, dtype="float16",
                   index_min_tokens=2048, index_regrow_factor=0.0)
        with rt.create_session(**cfg) as a, rt.create_session(**cfg) as b:
            for lo, hi in chunks:
                b.append(0, k[lo:hi], v[lo:hi])
                with torch.cuda.stream(stream):
                    torch.cuda._sleep(2_000_000)  # about a millisecond of queued work
                a.append_async(0, k[lo:hi], v[lo:hi], stream=stream)
                # Queued, not waited for (the first chunk trains the index, which waits).
                assert stream.query() == (lo == 0)
            assert len(a) == len(b) == n
            outs = {}
            for name, s, st in (("async", a, stream), ("plain", b, None)):
                for method, kw in (("dense", {}), ("ssa", dict(budget=400, seed=5, step=2))):
                    out = torch.empty((8, 64), dtype=torch.float16, device="cuda")
                    s.decode(0, q, method=method, out=out, stream=st, **kw)
                    outs[name, method] = out
            torch.cuda.synchronize()
            for method in ("dense", "ssa"):
                assert torch.equal(outs["async", method], outs["plain", method]), method
            assert not torch.equal(outs["plain", "dense"], outs["plain", "ssa"])  # sparse here
            # The CPU backend on the same data agrees with the dense decode.
            want = _cpu_reference(k.cpu().numpy(), v.cpu().numpy(), q.cpu().numpy(), "dense")
            got = outs["plain", "dense"].float().cpu().numpy()
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
