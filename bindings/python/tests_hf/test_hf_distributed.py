"""ssa.hf with an SSACache whose runtime is a group of processes (process_group=True,
torch.distributed gloo): two CPU processes, each holding one shard of an 8400-token
context of a tiny random Llama, generate greedily the same tokens, with bitwise the
same logits, as one process alone; the group's save loads into one process and into a
group of three, which generate on as the process alone does. The processes run hf_distributed_worker.py."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import torch.distributed  # noqa: E402

pytestmark = pytest.mark.model

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_processes_generate_what_one_does(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    worker = os.path.join(HERE, "hf_distributed_worker.py")
    runs = [("single", 0, 1, tmp_path / "single.json")] + [("group", r, 2, tmp_path / ("rank%d.json" % r))
                                                           for r in range(2)]
    saved = str(tmp_path / "group-cache")
    results = _run(worker, env, [[m, str(r), str(w), str(tmp_path / "init"), str(o), saved] for m, r, w, o in runs])
    alone, ranks = results[0], results[1:]
    assert alone["shards"] == 1 and all(g["shards"] == 2 for g in ranks)
    assert len(alone["tokens"]) == 6
    for g in ranks:
        assert g["tokens"] == alone["tokens"]
        assert g["logits"] == alone["logits"]
    # The two ranks' save, restored into one process and into a group of three (whose
    # third rank holds none of the 8406 rows: 8192 per shard), generates on as the
    # process alone does.
    tokens = str(tmp_path / "rank0.json")
    resumed = _run(worker, env, [["resume", "0", "1", tokens, str(tmp_path / "resumed.json"), saved]] +
                   [["groupresume", str(r), "3", str(tmp_path / "init3"), str(tmp_path / ("resumed%d.json" % r)),
                     saved, tokens] for r in range(3)])
    assert [r["shards"] for r in resumed] == [1, 3, 3, 3]
    assert len(alone["more"]) == 6
    for r in resumed:
        assert r["more"] == alone["more"]


def _run(worker, env, arg_lists):
    """Runs the workers at once; their JSON results, in order."""
    procs = [subprocess.Popen([sys.executable, worker] + args, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for args in arg_lists]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=600)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for args, p, log in zip(arg_lists, procs, logs):
        assert p.returncode == 0, "%s %s failed:\n%s" % (args[0], args[1], log)
    return [json.load(open(args[4])) for args in arg_lists]
