"""Group selection against per-head selection at equal rows read
(docs/GROUP_SELECTION.md, "What the budget means").

At the same `budget`, a KV group's selection takes G * k' middle rows, while G
per-head selections take the union of their picks, which is smaller wherever the
heads agree. To compare at equal bytes, EqualRowsCache runs each libssa decode of
a group-selection run twice: first per-head selection with the run's own
parameters (traced, output discarded), whose per-KV-head union U of distinct rows
(mean over KV heads) sets the group decode's budget

    budget_g = n_fixed + ceil((U - n_fixed) / G),   n_fixed = n_sink + n_local,

so that G * k'_g equals the union's middle rows; then the group decode at
budget_g, whose output the model uses. The mapping is made per decode (layer,
step, query), on the very session the run has grown.
"""
from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np


def kv_unions(trace, n_kv: int) -> List[int]:
    """Distinct rows read per KV head in one decode's ssa.DecodeTrace: the union of
    its query heads' rows (what the attention reads once for the group)."""
    g = len(trace) // n_kv
    out = []
    for kv in range(n_kv):
        lo, hi = int(trace.offsets[kv * g]), int(trace.offsets[(kv + 1) * g])
        out.append(int(np.unique(trace.tokens[lo:hi]).size))
    return out


def equal_rows_budget(unions: Sequence[int], group_size: int, n_fixed: int, n_tokens: int) -> int:
    """The group budget whose G * k' equals the mean per-head union's middle rows."""
    u = float(np.mean(unions))
    if u >= n_tokens:          # the per-head decode read everything: so does the group's
        return int(n_tokens)
    return int(n_fixed + math.ceil(max(u - n_fixed, 0.0) / group_size))


def make_cache_class():
    """EqualRowsCache, defined once ssa.hf is importable (the eval imports it late)."""
    import ssa.hf
    from ssa.hf import _params

    class EqualRowsCache(ssa.hf.SSACache):
        """An SSACache whose group-selection decodes read as many distinct rows as
        per-head selection would at the same step (equal_rows_group: "off" = a
        plain SSACache; "mixture" or "mean_query")."""

        equal_rows_group = "off"
        last_equal_rows_budget = None

        def _decode(self, layer, q, step, params=None, observe=True):
            if not observe or params is not None or self.equal_rows_group == "off":
                return super()._decode(layer, q, step, params, observe)
            qs = self._to_session(q)
            base = dict(self.params, group_selection="off")
            kw = _params.library_kwargs(base)
            kw["step"] = step
            g = self.shape.n_q_heads // self.shape.n_kv_heads
            budgets = []
            for b, s in enumerate(self.sessions):
                _, st, tr = s.decode_traced(layer.slot, qs[b], **kw)
                budgets.append(equal_rows_budget(kv_unions(tr, self.shape.n_kv_heads), g,
                                                 base["n_sink"] + base["n_local"], st.context_tokens))
            # One budget per decode call: the sessions of a batch share it (the eval runs one).
            self.last_equal_rows_budget = max(budgets)
            p = dict(self.params, budget=self.last_equal_rows_budget, group_selection=self.equal_rows_group)
            return super()._decode(layer, q, step, p, observe)

    return EqualRowsCache
