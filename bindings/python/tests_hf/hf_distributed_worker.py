"""One process of test_hf_distributed.py: greedy generation of a tiny random Llama
through an SSACache, either alone or as one rank of a torch.distributed (gloo) group.

usage: hf_distributed_worker.py MODE RANK WORLD INIT_FILE OUT_FILE [SAVE_DIR]
  single: generates NEW tokens, then NEW more on the same cache;
  group:  one rank; generates NEW tokens, then saves the cache to SAVE_DIR (every rank);
  resume: loads SAVE_DIR in this one process (INIT_FILE: a group rank's OUT_FILE, for
          its tokens) and generates NEW more.
  groupresume: one rank of a group of WORLD (INIT_FILE: the group's rendezvous file);
          loads SAVE_DIR into the group and generates NEW more (TOKENS_FILE, the
          seventh argument: a group rank's OUT_FILE, for its tokens).
"""
import datetime
import json
import sys

import torch
import transformers

import ssa.hf

PROMPT = 8400  # past one shard of 8192 tokens: both ranks hold rows
NEW = 6


def main(argv):
    mode, rank, world, init_file, out_file = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    torch.set_num_threads(1)  # the same q bits in every process
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                   max_position_embeddings=16384, initializer_range=0.1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="ssa").eval()
    ids = torch.randint(0, 97, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    kw = dict(method="ssa", sparsity=20, threads=1, progress_min_tokens=None)
    if mode in ("resume", "groupresume"):
        if mode == "groupresume":
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=300))
            first = json.load(open(argv[6]))["tokens"]
            cache = ssa.hf.SSACache.load(argv[5], model, threads=1, process_group=True, shard_tokens=8192)
        else:
            first = json.load(open(init_file))["tokens"]
            cache = ssa.hf.SSACache.load(argv[5], model, threads=1)
        seq = torch.cat([ids, torch.tensor([first])], dim=1)
        with torch.no_grad():
            more = model.generate(seq, past_key_values=cache, max_new_tokens=NEW, do_sample=False)
        with open(out_file, "w") as f:
            json.dump({"more": more[0, seq.shape[1]:].tolist(), "shards": cache.runtime.shards}, f)
        if mode == "groupresume":
            dist.destroy_process_group()
        return 0
    if mode == "group":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
        cache = ssa.hf.SSACache(model, process_group=True, shard_tokens=8192, **kw)
    else:
        cache = ssa.hf.SSACache(model, **kw)
    with torch.no_grad():
        out = model.generate(ids, past_key_values=cache, max_new_tokens=NEW, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    result = {"tokens": out.sequences[0, PROMPT:].tolist(),
              "logits": [lg[0].double().tolist() for lg in out.logits],
              "shards": cache.runtime.shards}
    if mode == "single":
        with torch.no_grad():
            more = model.generate(out.sequences, past_key_values=cache, max_new_tokens=NEW, do_sample=False)
        result["more"] = more[0, out.sequences.shape[1]:].tolist()
    else:
        cache.save(argv[5])  # a collective call: each rank writes its shard, rank 0 the set's manifest
    with open(out_file, "w") as f:
        json.dump(result, f)
    if mode == "group":
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
