"""What the evaluation runs: context lengths per model, the documents, the
RULER contexts (task x length x seed), and the prompt token ids of each, so
that the prefill stage and the decode stage agree on them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import documents
import ruler

LENGTHS = {"smollm2": [4096, 8192], "gemma3": [16384, 32768]}
DOC_NAMES = ["pydoc_topics", "licenses", "pydecimal"]
DOC_STEPS = 32          # teacher-forced continuation steps per document
ROOM = 64               # positions kept free at the end of the model's range for questions/answers
NIAH_HAYSTACK = "pydoc_topics"


def doc_context(length: int) -> int:
    """Prefilled tokens of a document evaluated at `length`."""
    return length - ROOM


@dataclass
class DocRun:
    doc: str
    length: int
    ids: List[int]          # context + DOC_STEPS + 1 continuation tokens
    n_context: int


def doc_ids(loaded, doc: str) -> List[int]:
    return loaded.encode(documents.text(doc))


def doc_run(loaded, doc: str, length: int, ids: Optional[List[int]] = None) -> DocRun:
    ids = ids if ids is not None else doc_ids(loaded, doc)
    n = doc_context(length)
    if len(ids) < n + DOC_STEPS + 1:
        raise SystemExit("%s has only %d tokens, %d needed" % (doc, len(ids), n + DOC_STEPS + 1))
    return DocRun(doc, length, ids[: n + DOC_STEPS + 1], n)


_hay = {}


def ruler_context(loaded, task: str, length: int, seed: int) -> ruler.Context:
    if NIAH_HAYSTACK not in _hay:
        _hay[NIAH_HAYSTACK] = documents.text(NIAH_HAYSTACK)

    def n_tokens(s):
        return len(loaded.encode(s))
    return ruler.make(task, seed, length - ROOM, n_tokens, _hay[NIAH_HAYSTACK])
