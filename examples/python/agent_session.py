"""An agent's long-lived attention session with libssa.

The history has the structure real attention has (as examples/long_context_demo.cc
and the tests' structured context): an attention sink at token 0, topics arriving
in bursts (each burst's keys cluster around its topic, values correlate with it),
a recent stretch on the query's topic, and a few "needle" tokens far back that the
query matches strongly. One query is decoded densely and with PQ top-k, SSA and
SSA_ADAPTIVE at 20x; then the session is checkpointed, restored and continued.

Run: python examples/python/agent_session.py   (after installing bindings/python, README.md)
"""
import os
import tempfile

import numpy as np

import ssa

N_LAYERS, N_Q, N_KV, HEAD_DIM = 2, 8, 2, 64
N_TOKENS, SPARSITY = 32768, 20
N_TOPICS, N_NEEDLES, RECENT = 64, 4, 256
rng = np.random.default_rng(7)

# Topic centres per KV head: keys cluster around key_centres, values around value_centres.
key_centres = rng.standard_normal((N_TOPICS, N_KV, HEAD_DIM))
value_centres = rng.standard_normal((N_TOPICS, N_KV, HEAD_DIM))
query_topics = (3, 17, 40)  # what the current query is about, in order of weight


def topic_sequence(n):
    """Topics in bursts of 32..512 tokens; the last RECENT tokens on the query's topic."""
    seq = np.empty(n, dtype=np.int64)
    t = 0
    while t < n:
        length = int(rng.integers(32, 513))
        seq[t:t + length] = rng.integers(N_TOPICS)
        t += length
    seq[-RECENT:] = query_topics[0]
    return seq


def history(n):
    topics = topic_sequence(n)
    k = key_centres[topics] + 0.55 * rng.standard_normal((n, N_KV, HEAD_DIM))
    v = value_centres[topics] + 0.6 * rng.standard_normal((n, N_KV, HEAD_DIM))
    k[0] = 3.0 * key_centres[0]  # the attention sink
    needles = rng.choice(np.arange(1000, n // 2), N_NEEDLES, replace=False)
    k[needles] = 1.4 * key_centres[query_topics[0]]  # far back, matched more than any topic
    return k.astype(np.float16), v.astype(np.float16), needles


def query():
    """A mix of the three query topics of each head's KV head; logits of ~6 on topic 3."""
    mix = sum(w * key_centres[t] for w, t in zip((1.0, 0.7, 0.5), query_topics))
    q = np.repeat(mix, N_Q // N_KV, axis=0) * 6.0 / np.sqrt(HEAD_DIM)
    q += 0.3 * rng.standard_normal((N_Q, HEAD_DIM)) / np.sqrt(HEAD_DIM)
    return q.astype(np.float16)


def rel_err(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


with ssa.Runtime(backend="cpu", seed=2024) as rt, \
        rt.create_session(N_LAYERS, N_Q, N_KV, HEAD_DIM, "float16") as session:
    for layer in range(N_LAYERS):
        k, v, needles = history(N_TOKENS)
        for t in range(0, N_TOKENS, 4096):  # appended turn by turn; the PQ index follows
            session.append(layer, k[t:t + 4096], v[t:t + 4096])
    print("history: %d tokens in %d layers (sink at 0, topic bursts, %d needles, the last %d "
          "tokens on the query's topic)" % (len(session), N_LAYERS, N_NEEDLES, RECENT))

    q = query()
    dense, dst = session.decode(0, q, method="dense", stats=True)
    budget = -(-N_TOKENS // SPARSITY)
    print("\none query at %dx sparsity: each head reads %d of %d K/V rows (128 sink + 128 local "
          "always, the rest chosen by the method)" % (SPARSITY, budget, N_TOKENS))
    print("error = ||out - dense|| / ||dense|| over all heads; heavy = rows taken by PQ proxy "
          "score, draws = rows sampled in proportion to it (per head)")
    for method in ("pq_topk", "ssa", "ssa_adaptive"):
        out, st = session.decode(0, q, method=method, sparsity=SPARSITY, seed=1, step=0, stats=True)
        print("  %-13s error %.4f  rows read %5d  heavy %5d  draws %5d"
              % (method, rel_err(out, dense), st.tokens_read // N_Q, st.heavy_tokens // N_Q,
                 st.draws // N_Q))
    print("PQ top-k keeps only the proxy's top rows and drops the tail's mass; SSA reads the top "
          "rows exactly and samples the tail, reweighting each draw by 1/inclusion probability (this synthetic context favours SSA more than a real model does: 2-3x lower error there, docs/FIDELITY.md)")

    path = os.path.join(tempfile.mkdtemp(), "agent.ssa")
    try:
        session.checkpoint(path)
    except ssa.Unsupported as e:
        print("snapshots are not available in this libssa build (%s); skipping restore" % e.message)
    else:
        with rt.load(path, verify=True) as restored:
            a = session.decode(0, q, method="ssa", sparsity=SPARSITY, seed=1, step=1)
            b = restored.decode(0, q, method="ssa", sparsity=SPARSITY, seed=1, step=1)
            print("\nrestored %d tokens from %s: same seed and step decode bitwise equal: %s"
                  % (len(restored), os.path.basename(path), bool(np.array_equal(a, b))))
            # A new turn on the query's own topic: it takes attention mass, so the output moves.
            t = query_topics[0]
            k = (key_centres[t] + 0.55 * rng.standard_normal((64, N_KV, HEAD_DIM))).astype(np.float16)
            v = (value_centres[t] + 0.6 * rng.standard_normal((64, N_KV, HEAD_DIM))).astype(np.float16)
            for layer in range(N_LAYERS):
                restored.append(layer, k, v)
            c = restored.decode(0, q, method="ssa", sparsity=SPARSITY, seed=1, step=2)
            c_dense = restored.decode(0, q, method="dense")
            print("continued to %d tokens with 64 on the query's topic: the output moved by %.3f "
                  "(relative; new tokens take attention), SSA error there %.4f"
                  % (len(restored), rel_err(c_dense, a), rel_err(c, c_dense)))
