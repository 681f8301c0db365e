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
