"""eval/trace_replay.py on synthetic traces whose overlaps and LRU hit rates are
known in closed form, written and read back through eval/trace_log.py.
Run: python3 -m pytest eval/test_trace_replay.py"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_log  # noqa: E402
import trace_replay  # noqa: E402


class FakeTrace:
    """The part of ssa.DecodeTrace that TraceLog reads: per-head rows."""

    def __init__(self, heads):
        self.heads = [np.asarray(sorted(set(h)), dtype=np.uint32) for h in heads]

    def __len__(self):
        return len(self.heads)

    def head(self, h):
        return self.heads[h]


def write(tmp_path, steps, n_q=1, n_kv=1, n_sink=0, n_local=0, context=10000, layers=(0,)):
    """steps: per step, per layer index in `layers`, per query head, its rows."""
    log = trace_log.TraceLog(dict(model="synthetic", piece="t", method="ssa", sparsity=10, group_selection="off",
                                  n_q_heads=n_q, n_kv_heads=n_kv, n_sink=n_sink, n_local=n_local, page_tokens=256))
    for t, per_layer in enumerate(steps):
        for li, heads in zip(layers, per_layer):
            log.add(100 + t, li, FakeTrace(heads), context + t)
    path = str(tmp_path / "t.npz")
    log.save(path)
    return trace_log.load(path)


def sliding(t, width=100, shift=50):
    return list(range(t * shift, t * shift + width))


def test_round_trip_keeps_every_segment(tmp_path):
    d = write(tmp_path, [[[[5, 1, 3], [2]]], [[[7], [9, 8]]]], n_q=2)
    segs = list(trace_replay.segments(d))
    assert [(p, l, h, c, r.tolist()) for p, l, h, c, r in segs] == [
        (100, 0, 0, 10000, [1, 3, 5]), (100, 0, 1, 10000, [2]), (101, 0, 0, 10001, [7]), (101, 0, 1, 10001, [8, 9])]
    assert d["meta"]["method"] == "ssa"


def test_overlap_identical_disjoint_and_half(tmp_path):
    same = write(tmp_path, [[[list(range(40))]]] * 5)
    o = trace_replay.step_overlap(same)
    assert o["jaccard"] == 1.0 and o["prev_fraction"] == 1.0 and o["pairs"] == 4
    disjoint = write(tmp_path, [[[sliding(t, 100, 100)]] for t in range(4)])
    o = trace_replay.step_overlap(disjoint)
    assert o["jaccard"] == 0.0 and o["prev_fraction"] == 0.0
    half = write(tmp_path, [[[sliding(t)]] for t in range(6)])
    o = trace_replay.step_overlap(half)
    assert o["jaccard"] == pytest.approx(50 / 150) and o["prev_fraction"] == pytest.approx(0.5)


def test_middle_leaves_out_sink_and_local(tmp_path):
    # Sink 0..3 and local window (the last 4 of the context) always read; the middle
    # rows are disjoint from step to step.
    n = 1000
    steps = [[[list(range(4)) + [100 + 10 * t + i for i in range(5)] + list(range(n + t - 4, n + t))]]
             for t in range(3)]
    d = write(tmp_path, steps, n_sink=4, n_local=4, context=n)
    allrows = trace_replay.step_overlap(d)
    mid = trace_replay.step_overlap(d, middle_only=True)
    # all: 4 sink + 3 of the 4 local rows shared out of 13 read: 7 / 13; union 19
    assert allrows["prev_fraction"] == pytest.approx(7 / 13) and allrows["jaccard"] == pytest.approx(7 / 19)
    assert mid["prev_fraction"] == 0.0 and mid["jaccard"] == 0.0


def test_lru_hit_rate_known_answers(tmp_path):
    d = write(tmp_path, [[[sliding(t)]] for t in range(8)])
    steps = trace_replay.access_steps(d)
    # Each step reads 100 rows, 50 of them read at the step before. With >= 50
    # entries the LRU still holds them; with 25 it holds only the last 25 of the
    # step before, which the new rows (read first) evict before they are reached.
    assert trace_replay.lru_hit_rate(steps, 10 ** 6) == pytest.approx(0.5)
    assert trace_replay.lru_hit_rate(steps, 100) == pytest.approx(0.5)
    assert trace_replay.lru_hit_rate(steps, 50) == pytest.approx(0.5)
    assert trace_replay.lru_hit_rate(steps, 25) == 0.0
    same = trace_replay.access_steps(write(tmp_path, [[[list(range(40))]]] * 4))
    assert trace_replay.lru_hit_rate(same, 40) == 1.0
    assert trace_replay.lru_hit_rate(same, 39) == 0.0   # LRU thrashes on a loop one longer than it
    assert trace_replay.lru_hit_rate(same, 40, skip_first=0) == pytest.approx(0.75)


def test_group_union_layers_and_pages(tmp_path):
    # 2 query heads share one KV head: the group reads the union once; two layers
    # are separate entries; pages of 64 tokens.
    steps = [[[[0, 1, 2], [2, 3]], [[0]]], [[[64, 65], [0]], [[0]]]]
    d = write(tmp_path, steps, n_q=2, n_kv=1, layers=(3, 7))
    rows = trace_replay.access_steps(d)
    assert [len(s) for s in rows] == [4 + 1, 3 + 1]
    assert trace_replay.lru_hit_rate(rows, 100) == pytest.approx(2 / 4)   # rows 0 (layer 3), 0 (layer 7) hit
    pages = trace_replay.access_steps(d, page_tokens=64)
    assert [len(s) for s in pages] == [2, 3]                               # layer 3: page 0 | pages 0, 1
    assert trace_replay.lru_hit_rate(pages, 100) == pytest.approx(2 / 3)


def test_replay_reports_fractions_of_the_context(tmp_path):
    d = write(tmp_path, [[[sliding(t)]] for t in range(8)], context=1000)
    r = trace_replay.replay(d, fractions=[0.025, 0.05, 1.0], pages=[64])
    c = r["cache"][("all", "row")]
    assert c["accessed_fraction"] == pytest.approx(0.1)
    assert c["hit"] == {0.025: 0.0, 0.05: pytest.approx(0.5), 1.0: pytest.approx(0.5)}
    assert r["overlap"]["all"]["prev_fraction"] == pytest.approx(0.5)
    text = trace_replay.markdown([("t.npz", r)], [0.025, 0.05, 1.0])
    assert "| t | ssa | 10x | off | 1000 | 8 |" in text
