"""Sessions across processes over torch.distributed (gloo): groups of 2, 3 and 4 CPU
processes, each process a rank of ssa.distributed.runtime, decode every method and group
mode bitwise as one unsharded process does (outputs and stats), after appends across
shard boundaries, a fork, and a truncation into a shard with regrowth; each group saves
its session (a file per rank, each holding its shard's pages, and a manifest), which
loads into one process and into a group of another size; a snapshot of one process
loads into each group; a rank that dies gives its peer ssa.IOError within the
collective timeout, then at once. The processes run distributed_worker.py (one world
of 4, the groups as its subgroups)."""
import glob
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed  # noqa: E402

import ssa  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import distributed_worker as W  # noqa: E402

if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORLD = 4


def reference(out_dir):
    k, v, q = W.data()
    with ssa.Runtime(backend="cpu", threads=2, seed=1234) as rt:
        s = W.make_session(rt)
        want = W.history(s, k, v, q)
        s.save(str(out_dir / "single.ssa"))
        want["loaded"] = W.grid(s, q)
        want["from_group"] = want["truncated"]  # each group saved after the history
        s.close()
    return want


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The reference, then one run of the world; its files and the reference."""
    out = tmp_path_factory.mktemp("distributed")
    want = reference(out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "distributed_worker.py"), str(r), str(WORLD),
                               str(out / "init"), str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
             for r in range(WORLD)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=600)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, p in enumerate(procs):
        assert p.returncode == 0, "process %d failed:\n%s" % (r, logs[r])
    return out, want


def check(want, got, what):
    assert len(got) == len(want)
    assert len({o for o, _ in want}) > 1  # the grid's outputs differ: nothing trivially equal
    for i, (a, b) in enumerate(zip(want, got)):
        assert a[0] == b[0], "%s: decode %d differs from the unsharded output" % (what, i)
        assert a[1] == b[1], "%s: decode %d stats %s != %s" % (what, i, b[1], a[1])


@pytest.mark.parametrize("size", W.SIZES)
def test_group_decodes_bitwise_as_one_process(run, size):
    out, want = run
    for r in range(size):
        with open(out / ("size%d_rank%d.json" % (size, r))) as f:
            got = {key: [(bytes.fromhex(o), tuple(st)) for o, st in v] for key, v in json.load(f).items()}
        for what in ("grid", "truncated", "fork", "loaded", "from_group"):
            check(want[what], got[what], "%s, rank %d of %d" % (what, r, size))


@pytest.mark.parametrize("size", W.SIZES)
def test_group_snapshot_loads_in_one_process(run, size):
    out, want = run
    _, _, q = W.data()
    with ssa.Runtime(backend="cpu", threads=1, seed=1234) as rt:
        s = rt.load(str(out / ("group%d.ssa" % size)))
        check(want["truncated"], W.grid(s, q), "group of %d's snapshot in one process" % size)
        s.close()
    # One file per rank, each with its own shard's pages only: together about the
    # one process's file, each well below it but the last rank's (it holds the rest).
    parts = sorted(glob.glob(str(out / ("group%d.ssa.*.rank*" % size))))
    assert len(parts) == size
    whole = os.path.getsize(out / "single.ssa")
    sizes = [os.path.getsize(p) for p in parts]
    assert 0.9 * whole < sum(sizes) < 1.2 * whole
    assert all(b < 0.6 * whole for b in sizes[:-1])


def test_a_dead_rank_gives_an_error_not_a_hang(run):
    out, _ = run
    with open(out / "die.json") as f:
        result = json.load(f)
    assert result["raised"] == "IOError", result
    assert result["status"] == ssa.Status.IO
    assert result["seconds"] < 30, result
    assert result["second"] == "IOError", result  # the group is out of step: refused at once
