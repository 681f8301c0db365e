"""An agent's long-lived attention session with libssa.

Builds a structured history (system prompt, tool calls, tool results: each turn's keys
cluster around its own topic), decodes one query densely and sparsely, prints the
relative error and the tokens read, then checkpoints, restores and continues.

Run: python examples/python/agent_session.py   (after `pip install bindings/python`)
"""
import os
import tempfile

import numpy as np

import ssa

N_LAYERS, N_Q, N_KV, HEAD_DIM = 2, 8, 2, 64
rng = np.random.default_rng(7)


def turn(n_tokens, topic):
    """K/V for one turn: keys near the turn's topic vector, values random."""
    k = topic + 0.4 * rng.standard_normal((n_tokens, N_KV, HEAD_DIM))
    v = rng.standard_normal((n_tokens, N_KV, HEAD_DIM))
    return k.astype(np.float16), v.astype(np.float16)


def rel_err(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


with ssa.Runtime(backend="cpu", seed=2024) as rt, \
        rt.create_session(N_LAYERS, N_Q, N_KV, HEAD_DIM, "float16") as session:
    topics = 1.5 * rng.standard_normal((12, N_KV, HEAD_DIM))
    for i, n in enumerate([400] + [300, 250, 350, 200] * 2 + [300, 280, 320]):  # 3500 tokens
        k, v = turn(n, topics[i % len(topics)])
        for layer in range(N_LAYERS):
            session.append(layer, k, v)
    print("history: %d tokens in %d layers" % (len(session), N_LAYERS))

    # A query about topic 3 (a tool result from a while ago).
    q = (1.0 * np.repeat(topics[3], N_Q // N_KV, axis=0)
         + 0.3 * rng.standard_normal((N_Q, HEAD_DIM))).astype(np.float16)
    dense, dst = session.decode(0, q, method="dense", stats=True)
    for method in ("pq_topk", "ssa", "ssa_adaptive"):
        out, st = session.decode(0, q, method=method, sparsity=10, n_sink=32, n_local=64,
                                 seed=1, step=0, stats=True)
        print("%-13s rel. error vs dense %.4f, tokens read %6d of %d"
              % (method, rel_err(out, dense), st.tokens_read, dst.tokens_read))

    path = os.path.join(tempfile.mkdtemp(), "agent.ssa")
    try:
        session.checkpoint(path)
    except ssa.Unsupported as e:
        print("snapshots are not available in this libssa build (%s); skipping restore" % e.message)
    else:
        with rt.load(path, verify=True) as restored:
            k, v = turn(64, topics[5])
            for layer in range(N_LAYERS):
                restored.append(layer, k, v)
            a = session.decode(0, q, method="ssa", sparsity=10, seed=1, step=1)
            print("restored %d tokens, continued to %d" % (len(session), len(restored)))
            b = restored.decode(0, q, method="ssa", sparsity=10, seed=1, step=1)
            print("restored+64 tokens vs original: rel. difference %.4f" % rel_err(b, a))
