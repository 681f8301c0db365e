"""ssa.hf with an SSACache whose runtime is a group of processes (process_group=True,
torch.distributed gloo): two CPU processes, each holding one shard of an 8400-token
context of a tiny random Llama, generate greedily the same tokens, with bitwise the
same logits, as one process alone. The processes run hf_distributed_worker.py."""
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
    procs = [subprocess.Popen([sys.executable, worker, m, str(r), str(w), str(tmp_path / "init"), str(o)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for m, r, w, o in runs]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=600)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for (m, r, _, _), p, log in zip(runs, procs, logs):
        assert p.returncode == 0, "%s %d failed:\n%s" % (m, r, log)
    results = [json.load(open(o)) for _, _, _, o in runs]
    alone, ranks = results[0], results[1:]
    assert alone["shards"] == 1 and all(g["shards"] == 2 for g in ranks)
    assert len(alone["tokens"]) == 6
    for g in ranks:
        assert g["tokens"] == alone["tokens"]
        assert g["logits"] == alone["logits"]
