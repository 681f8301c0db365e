"""Selection traces of an evaluation run, written compactly for replay
(eval/trace_replay.py): per libssa decode (step, layer, query head), the sorted
token indices that head read, from ssa_decode_traced via SSACache(traces=True).

File (numpy .npz, compressed):
  tokens   uint32  every segment's rows, concatenated
  offsets  int64   [n_segments + 1]: segment i is tokens[offsets[i]:offsets[i + 1]]
  position int64   the decode's RNG step (the token's position); steps of a run increase
  layer    int32   model layer
  head     int32   query head
  context  int64   tokens in the layer at that decode (N)
  meta     str     JSON: model, method, sparsity, group_selection, n_q_heads,
                   n_kv_heads, n_sink, n_local, page_tokens
"""
from __future__ import annotations

import json
from typing import Dict, List

import numpy as np


class TraceLog:
    def __init__(self, meta: Dict):
        self.meta = dict(meta)
        self.parts: List[np.ndarray] = []
        self.position: List[int] = []
        self.layer: List[int] = []
        self.head: List[int] = []
        self.context: List[int] = []

    def add(self, position: int, layer: int, trace, context: int) -> None:
        """One decode's ssa.DecodeTrace (all query heads of one sequence)."""
        for h in range(len(trace)):
            self.parts.append(np.asarray(trace.head(h), dtype=np.uint32))
            self.position.append(int(position))
            self.layer.append(int(layer))
            self.head.append(h)
            self.context.append(int(context))

    def __len__(self):
        return len(self.parts)

    def save(self, path: str) -> None:
        sizes = np.array([p.size for p in self.parts], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        tokens = np.concatenate(self.parts).astype(np.uint32) if self.parts else np.zeros(0, np.uint32)
        np.savez_compressed(path, tokens=tokens, offsets=offsets,
                            position=np.array(self.position, dtype=np.int64),
                            layer=np.array(self.layer, dtype=np.int32), head=np.array(self.head, dtype=np.int32),
                            context=np.array(self.context, dtype=np.int64), meta=np.array(json.dumps(self.meta)))


def load(path: str) -> Dict:
    with np.load(path, allow_pickle=False) as z:
        d = {k: z[k] for k in z.files}
    d["meta"] = json.loads(str(d["meta"]))
    return d
