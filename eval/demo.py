#!/usr/bin/env python3
"""Long-document question answering with SmolLM2-135M, decode attention served by
libssa: the document is prefilled densely (numpy) into a libssa session, then the
question and the answer are decoded token by token with a sparse method (SSA by
default) and, for comparison, with DENSE."""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets thread limits before numpy)

# Long texts every Debian/Ubuntu system has.
DEFAULT_DOCS = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GFDL-1.3",
                "/usr/share/common-licenses/Apache-2.0")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--doc", default=None,
                    help="a text file; default: the first of %s that exists" % ", ".join(DEFAULT_DOCS))
    ap.add_argument("--question", default="Which version of the GNU General Public License is this document?")
    ap.add_argument("--method", default="ssa", choices=common.METHODS[1:])
    ap.add_argument("--sparsity", type=float, default=20.0)
    ap.add_argument("--max-new", type=int, default=40)
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"),
                    help="libssa backend for the decode attention (auto: the GPU where present)")
    args = ap.parse_args()
    if args.doc is None:
        args.doc = next((d for d in DEFAULT_DOCS if os.path.exists(d)), None)
        if args.doc is None:
            sys.exit("none of %s exists; pass --doc FILE" % ", ".join(DEFAULT_DOCS))

    t_load = time.time()
    model = common.smollm.SmolLM()
    tok = model.tok
    text = open(args.doc, encoding="utf-8", errors="replace").read()
    doc_part = tok.encode("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                          "<|im_end|>\n<|im_start|>user\n" + text.strip() + "\n\n")
    question = tok.encode(args.question + "<|im_end|>\n<|im_start|>assistant\n")
    room = model.ctx_len - len(question) - args.max_new
    if len(doc_part) > room:
        print("document is %d tokens; keeping the first %d (model context %d)" % (len(doc_part), room, model.ctx_len))
        doc_part = doc_part[:room]
    N = len(doc_part)
    ns = common.sink_local(N)
    print("document %s: %d tokens in context; question: %s" % (args.doc, N, args.question))
    print("model loaded in %.1fs" % (time.time() - t_load), flush=True)

    t0 = time.time()
    logits0, K, V = common.cached_prefill(model, doc_part)
    t_prefill = time.time() - t0
    rt = common.runtime(args.backend)
    t0 = time.time()
    base = common.build_session(rt, model, K, V, host_pointers=rt.backend == "cuda")
    t_index = time.time() - t0
    del K, V
    print("prefill (dense, numpy): %.1fs (cached on disk after the first run); libssa append + PQ index "
          "(%s backend): %.1fs" % (t_prefill, rt.backend.upper(), t_index), flush=True)

    def stop(gen):
        return gen[-1] == tok.eos

    results = {}
    for method, sp in ((args.method, args.sparsity), ("dense", 1.0)):
        r = common.run_decode(model, base, N, logits0, question, method, sp, ns, ns, n_generate=args.max_new,
                              stop=stop)
        ans = tok.decode([t for t in r["generated"] if t != tok.eos]).strip()
        results[method] = (ans, r)
        label = "%s %gx" % (method.upper(), sp) if method != "dense" else "DENSE"
        print("\n[%s] answer: %s" % (label, ans))
        print("  decode steps %d, rows of K/V read per head and layer: %.1f of %.1f on average (%.1f%%), "
              "decode time %.1fs (%.0f ms/token incl. the numpy model)" % (
                  r["steps"], r["tokens_read_per_step"] / (model.n_q * model.n_layers),
                  N + (r["steps"] + 1) / 2.0, 100 * r["read_fraction"], r["seconds"], 1000 * r["seconds"] / max(r["steps"], 1)),
              flush=True)
    same = results[args.method][0] == results["dense"][0]
    print("\nsparse and dense answers %s" % ("are identical" if same else "differ"))
    print("(sink %d + local %d tokens always read; h = %.1f; seed %d)" % (ns, ns, common.HEAVY_FRACTION, common.SEED))
    base.close()


if __name__ == "__main__":
    main()
