"""Shared helpers: random (never zero) inputs and an independent float64 reference."""
import zlib

import numpy as np
import pytest

import ssa

N_Q, N_KV, HEAD_DIM = 8, 2, 64


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Rounds float32 to bfloat16 (nearest even) and returns the raw uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f64(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """float data -> the array a session of `dtype` takes."""
    if dtype == "float32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float16":
        return np.ascontiguousarray(x, dtype=np.float16)
    if dtype == "bfloat16":
        return f32_to_bf16_bits(x)
    raise AssertionError(dtype)


def to_f64(x: np.ndarray) -> np.ndarray:
    """Session-dtype array -> float64 (bfloat16 given as uint16 bits)."""
    if x.dtype == np.uint16:
        return bf16_bits_to_f64(x)
    return np.asarray(x, dtype=np.float64)


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Exact softmax attention in float64, GQA: q head h reads kv head h // (n_q / n_kv).

    q: [n_q, d]; k, v: [N, n_kv, d]."""
    q, k, v = to_f64(q), to_f64(k), to_f64(v)
    n_q, d = q.shape
    group = n_q // k.shape[1]
    out = np.empty((n_q, d))
    for h in range(n_q):
        kh = h // group
        s = k[:, kh, :] @ q[h] / np.sqrt(d)
        w = np.exp(s - s.max())
        out[h] = (w / w.sum()) @ v[:, kh, :]
    return out


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(to_f64(out) - ref) / np.linalg.norm(ref))


def random_kv(rng, n, n_kv=N_KV, d=HEAD_DIM, clusters=0):
    """Random K, V of shape [n, n_kv, d] in float32; clustered keys when clusters > 0."""
    if clusters:
        centers = rng.standard_normal((clusters, n_kv, d)) * 2.0
        which = rng.integers(0, clusters, size=n)
        k = centers[which] + 0.5 * rng.standard_normal((n, n_kv, d))
    else:
        k = rng.standard_normal((n, n_kv, d))
    v = rng.standard_normal((n, n_kv, d))
    return k.astype(np.float32), v.astype(np.float32)


def random_q(rng, n_q=N_Q, d=HEAD_DIM, scale=1.0):
    return (scale * rng.standard_normal((n_q, d))).astype(np.float32)


@pytest.fixture
def rng(request):
    # A fixed seed per test keeps failures reproducible; inputs still differ per test.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.fixture
def rt():
    with ssa.Runtime(backend="cpu", threads=2, seed=1234) as r:
        yield r


def make_session(rt, dtype="float32", n_layers=2, n_q=N_Q, n_kv=N_KV, d=HEAD_DIM, **kw):
    return rt.create_session(n_layers, n_q, n_kv, d, dtype, **kw)
