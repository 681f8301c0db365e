"""Checks of the evaluation's own pieces that need no model: the RULER generators,
the Wilson interval and the snapshot reader's bounds checks.
Run: python3 -m pytest eval/test_eval.py"""
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pq_proxy  # noqa: E402
import ruler  # noqa: E402


def words(s):
    return len(s.split())   # a stand-in tokenizer: one token per word


def haystack(seed=7, n=4000):
    r = random.Random(seed)
    return " ".join("Sentence %d has %s words." % (i, r.choice(["some", "many", "few"])) for i in range(n))


@pytest.mark.parametrize("task", ruler.TASKS)
def test_deterministic_sized_and_answerable(task):
    a = ruler.make(task, 3, 2000, words, haystack())
    b = ruler.make(task, 3, 2000, words, haystack())
    c = ruler.make(task, 4, 2000, words, haystack())
    assert a.prefix == b.prefix and [q.text for q in a.questions] == [q.text for q in b.questions]
    assert a.prefix != c.prefix
    longest = max(words(q.text) for q in a.questions)
    assert words(a.prefix) + longest <= 2000
    assert words(a.prefix) + longest > 1900          # filled close to the target
    for q in a.questions:
        for ans in q.answers:
            assert ans in a.prefix                   # every expected string is in the context
        assert not ruler.score(q, "no numbers here")
        assert ruler.score(q, " ".join(q.answers))


def test_multikey_distractors_and_multivalue_count():
    mk = ruler.make("niah_multikey", 0, 3000, words, haystack())
    keys = [n["key"] for n in mk.needles]
    assert len(set(keys)) == 4 and len(mk.questions) == 4
    mv = ruler.make("niah_multivalue", 0, 3000, words, haystack())
    assert len({n["key"] for n in mv.needles}) == 1 and len(mv.questions[0].answers) == 4
    vt = ruler.make("variable_tracking", 0, 3000, words, haystack())
    for ch in vt.needles:       # the chain's assignments appear in order
        pos = [vt.prefix.index("VAR %s =" % v) for v in ch["variables"]]
        assert pos == sorted(pos)


def test_wilson_known_values():
    assert harness.wilson(0, 10) == [0.0, 0.2775]
    assert harness.wilson(5, 10) == [0.2366, 0.7634]
    assert harness.wilson(10, 10) == [0.7225, 1.0]
    assert harness.wilson(0, 0) == [0.0, 1.0]


def test_snapshot_reader_rejects_bad_files(tmp_path):
    p = tmp_path / "x.ssa"
    p.write_bytes(b"\0" * 5000)
    with pytest.raises(ValueError, match="no valid superblock"):
        pq_proxy.Snapshot(str(p))
    hdr = bytearray(128)
    hdr[:8] = pq_proxy.MAGIC
    hdr[24:48] = (1).to_bytes(8, "little") + (4096).to_bytes(8, "little") + (10 ** 9).to_bytes(8, "little")
    p.write_bytes(bytes(hdr) + b"\0" * 5000)
    with pytest.raises(ValueError, match="beyond the file"):
        pq_proxy.Snapshot(str(p))


def test_proxy_scores_match_libssa_pq_topk(tmp_path):
    """The proxy read back from a snapshot ranks as libssa does: PQ_TOPK's output
    equals exact attention over sink + local + the top-k' of pq_proxy's scores."""
    ssa = pytest.importorskip("ssa")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(5)
    n, n_kv, g, d = 3000, 2, 2, 64
    rt = ssa.Runtime(backend="cpu", threads=1, seed=1)
    s = rt.create_session(n_layers=1, n_q_heads=n_kv * g, n_kv_heads=n_kv, head_dim=d, dtype="float32",
                          pq_subspaces=16)
    centers = rng.normal(size=(8, n_kv, d)).astype(np.float32)
    K = centers[rng.integers(0, 8, n)] + 0.3 * rng.normal(size=(n, n_kv, d)).astype(np.float32)
    V = rng.normal(size=(n, n_kv, d)).astype(np.float32)
    s.append(0, K, V)
    q = (2 * rng.normal(size=(n_kv * g, d))).astype(np.float32)
    ns, budget = 4, 40
    out = s.decode(0, q, method="pq_topk", budget=budget, n_sink=ns, n_local=ns)
    path = str(tmp_path / "s.ssa")
    s.save(path)
    snap = pq_proxy.Snapshot(path)
    assert np.array_equal(snap.keys(0), K.transpose(1, 0, 2))
    books, codes = snap.codebooks(0).astype(np.float64), snap.codes(0)
    sub = d // snap.M
    for h in range(n_kv * g):
        kv = h // g
        lut = np.einsum("ms,mcs->mc", q[h].astype(np.float64).reshape(snap.M, sub), books[kv])
        proxy = lut[np.arange(snap.M)[:, None], codes[kv, :, ns:n - ns]].sum(axis=0)
        top = ns + np.argsort(-proxy)[: budget - 2 * ns]
        sel = np.concatenate([np.arange(ns), top, np.arange(n - ns, n)])
        sc = K[sel, kv].astype(np.float64) @ q[h] / np.sqrt(d)
        p = np.exp(sc - sc.max())
        ref = (p / p.sum()) @ V[sel, kv]
        assert np.linalg.norm(out[h] - ref) / np.linalg.norm(ref) < 1e-4
    s.close()
    rt.close()
