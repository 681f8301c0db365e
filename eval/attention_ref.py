"""Dense attention of one decode step in numpy: the reference both model files and
the evaluation compare libssa against."""
import numpy as np


def dense_attention(q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """q [n_q, d] over K/V [n, n_kv, d]: scale 1/sqrt(d), GQA."""
    n_q, d = q.shape
    g = n_q // K.shape[1]
    out = np.empty_like(q)
    for h in range(n_q):
        sc = K[:, h // g, :] @ q[h] / np.sqrt(d)
        p = np.exp(sc - sc.max())
        out[h] = (p / p.sum()) @ V[:, h // g, :]
    return out
