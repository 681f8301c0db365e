"""RULER-style synthetic long-context tasks, generated here from the task
definitions of the RULER paper (Hsieh et al., "RULER: What's the Real Context
Size of Your Long-Context Language Models?", 2024):

- niah_single: one needle "One of the special magic numbers for KEY is: VALUE."
  in a haystack of real text; the question asks for KEY's number.
- niah_multikey: several needles with different keys; one key is asked, the
  others are distractors. Every key of one context is asked in turn, one trial
  each (each question decoded on its own fork of the prefilled context).
- niah_multivalue: several needles with the same key and different values; the
  question asks for all of them, and a trial is correct only if every value is in
  the answer.
- variable_tracking: chains of assignments "VAR A = 12345", "VAR B = A", ...
  scattered through repeated noise sentences; the question asks for every
  variable that holds a chain's value; correct only if the answer names all of
  the chain's variables. Each chain of one context is asked in turn.

Keys are words, values 7-digit numbers, variable names 5 capital letters, all
drawn from random.Random(seed), as are the needle depths (uniform in
[0.05, 0.95] of the haystack). A context is built to a token length with the
model's own tokenizer, so the same seed gives the same text for every model but
lengths are exact per model.

A Context carries the prompt up to the questions (`prefix`, prefilled once
densely and cached), and its Questions (`text`, decoded through the cache, then
the model's greedy answer), each with the strings a correct answer contains.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable, List, Sequence

TASKS = ["niah_single", "niah_multikey", "niah_multivalue", "variable_tracking"]

# Keys of the needles: common nouns, so each is one or two tokens in both models.
WORDS = ("apple anchor badge basket beacon blanket bottle bridge bucket cabin camera candle canyon carpet "
         "castle cellar chimney circus cobalt compass copper cottage crystal dolphin dragon engine falcon "
         "feather fountain garden glacier harbor helmet island jacket kettle ladder lantern lemon magnet "
         "marble meadow mirror monkey needle orchard oyster palace parrot pepper pigeon planet pocket "
         "puzzle quartz rabbit ribbon river rocket saddle shadow silver spider statue summit tiger tunnel "
         "turtle valley velvet violin walnut window winter wizard zebra").split()

NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the numbers afterwards.\n")
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


@dataclass
class Question:
    text: str                 # decoded through the cache after the prefix
    answers: List[str]        # every one must appear in the generated answer
    max_new: int              # greedy tokens generated after the question


@dataclass
class Context:
    task: str
    seed: int
    length: int               # target tokens of prefix + longest question
    prefix: str               # prefilled densely
    questions: List[Question]
    needles: List[dict] = field(default_factory=list)   # what was inserted where (for the record)


def _value(rng: random.Random) -> str:
    return str(rng.randint(1000000, 9999999))


def _var(rng: random.Random, used: set) -> str:
    while True:
        v = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if v not in used:
            used.add(v)
            return v


def _sentences(text: str) -> List[str]:
    """Real text cut after sentence ends and blank lines, so a needle never
    splits a word."""
    parts = re.split(r"(?<=[.!?])\s+|\n\s*\n", text)
    return [p.strip() + " " for p in parts if p.strip()]


def _assemble(pieces: Sequence[str], needles: Sequence[str], depths: Sequence[float]) -> str:
    """Haystack pieces with each needle inserted before the piece at its depth."""
    at = sorted((int(round(d * len(pieces))), i) for i, d in enumerate(depths))
    out, j = [], 0
    for k, p in enumerate(pieces):
        while j < len(at) and at[j][0] == k:
            out.append(needles[at[j][1]] + " ")
            j += 1
        out.append(p)
    out.extend(needles[i] + " " for _, i in at[j:])
    return "".join(out)


def _fit(n_tokens: Callable[[str], int], build: Callable[[int], str], target: int, upper: int) -> str:
    """The longest build(n) (n haystack pieces, n <= upper) whose token count is
    at most target: a binary search over n."""
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n_tokens(build(mid)) <= target:
            lo = mid
        else:
            hi = mid - 1
    return build(lo)


def _niah_question(key: str) -> str:
    return ("\nWhat is the special magic number for %s mentioned in the provided text? "
            "The special magic number for %s mentioned in the provided text is" % (key, key))


def make(task: str, seed: int, length: int, n_tokens: Callable[[str], int], haystack: str,
         n_keys: int = 4, n_values: int = 4, n_chains: int = 2, n_hops: int = 4) -> Context:
    """One context of `task` whose prefix plus its longest question is at most
    `length` tokens by n_tokens (the model's tokenizer; BOS counted by it).
    haystack: real text for the needle tasks (variable tracking uses RULER's
    repeated noise sentences)."""
    rng = random.Random("%s-%d" % (task, seed))
    if task == "variable_tracking":
        used: set = set()
        chains, needles = [], []
        for _ in range(n_chains):
            value = str(rng.randint(10000, 99999))
            names = [_var(rng, used) for _ in range(n_hops + 1)]
            chains.append((value, names))
            needles.append(["VAR %s = %s." % (names[0], value)] +
                           ["VAR %s = VAR %s." % (names[i + 1], names[i]) for i in range(n_hops)])
        # Each chain's assignments appear in order, at increasing random depths.
        flat, depths = [], []
        for ch in needles:
            ds = sorted(rng.uniform(0.05, 0.95) for _ in ch)
            flat.extend(ch)
            depths.extend(ds)
        qs = [Question(text="\nQuestion: Find all variables that are assigned the value %s in the text above. "
                            "Answer: According to the chain(s) of variable assignment in the text above, "
                            "%d variables are assigned the value %s, they are:" % (v, len(names), v),
                       answers=list(names), max_new=8 * len(names))
              for v, names in chains]
        longest = max(n_tokens(q.text) for q in qs)
        pieces_all = [VT_NOISE] * (length // 4)

        def build(n):
            return VT_INTRO + _assemble(pieces_all[:n], flat, depths)
        prefix = _fit(n_tokens, build, length - longest, len(pieces_all))
        rec = [dict(value=v, variables=names) for v, names in chains]
        return Context(task, seed, length, prefix, qs, rec)

    pieces_all = _sentences(haystack)
    if task == "niah_single":
        keys, vals = [rng.choice(WORDS)], None
        vals = [[_value(rng)]]
    elif task == "niah_multikey":
        keys = rng.sample(WORDS, n_keys)
        vals = [[_value(rng)] for _ in keys]
    elif task == "niah_multivalue":
        keys = [rng.choice(WORDS)]
        vals = [[_value(rng) for _ in range(n_values)]]
    else:
        raise ValueError("unknown task %r (one of %s)" % (task, ", ".join(TASKS)))
    needles, depths, rec = [], [], []
    for k, vs in zip(keys, vals):
        for v in vs:
            d = rng.uniform(0.05, 0.95)
            needles.append("One of the special magic numbers for %s is: %s." % (k, v))
            depths.append(d)
            rec.append(dict(key=k, value=v, depth=round(d, 4)))
    if task == "niah_multivalue":
        k = keys[0]
        qs = [Question(text="\nWhat are all the special magic numbers for %s mentioned in the provided text? "
                            "The special magic numbers for %s mentioned in the provided text are" % (k, k),
                       answers=list(vals[0]), max_new=12 * len(vals[0]))]
    else:
        qs = [Question(text=_niah_question(k), answers=vs, max_new=12) for k, vs in zip(keys, vals)]
    longest = max(n_tokens(q.text) for q in qs)
    # The haystack is read from a seed-dependent starting sentence, so trials
    # differ in their text as well as in their needles.
    start = rng.randrange(max(1, len(pieces_all) // 2))
    pieces = (pieces_all[start:] + pieces_all[:start])

    def build(n):
        return NIAH_INTRO + _assemble(pieces[:n], needles, depths)
    prefix = _fit(n_tokens, build, length - longest, len(pieces))
    return Context(task, seed, length, prefix, qs, rec)


def score(q: Question, answer: str) -> bool:
    """Correct iff every expected string occurs in the generated answer (RULER's
    string-match scoring, all-or-nothing per question)."""
    return all(a in answer for a in q.answers)
