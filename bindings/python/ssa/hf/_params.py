"""Decode parameters of an SSACache, checked when they are set (not at the first decode)."""
import math

from .._core import METHODS
from .._errors import invalid

DEFAULTS = dict(method="ssa", sparsity=20.0, budget=None, h=0.4, n_sink=128, n_local=128, seed=0,
                group_selection="off")
GROUP_SELECTIONS = ("off", "mixture", "mean_query")
BACKENDS = ("auto", "cpu", "cuda")


def _number(name, v, lo, hi=math.inf, lo_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise invalid("%s must be a number, got %r" % (name, v))
    v = float(v)
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        raise invalid("%s=%r is out of range %s%g, %g]" % (name, v, "(" if lo_open else "[", lo, hi))
    return v


def _count(name, v, lo, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
        raise invalid("%s must be an integer%s, got %r" % (name, " or None" if allow_none else "", v))
    v = int(v.__index__())
    if v < lo or v >= 1 << 32 and name != "seed" or v >= 1 << 64:
        raise invalid("%s=%d is out of range (at least %d)" % (name, v, lo))
    return v


def check(params: dict, base: dict = None) -> dict:
    """base updated with params, every value checked; unknown names refused."""
    out = dict(DEFAULTS if base is None else base)
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise invalid("unknown decode parameter(s) %s; expected %s" % (", ".join(unknown), ", ".join(DEFAULTS)))
    for k, v in params.items():
        if k == "method":
            m = getattr(v, "name", v)
            if not isinstance(m, str) or m.lower() not in METHODS:
                raise invalid("method=%r is not one of %s" % (v, ", ".join(METHODS)))
            v = m.lower()
        elif k == "sparsity":
            v = _number("sparsity", v, 1.0)
        elif k == "h":
            v = _number("h", v, 0.0, 1.0)
        elif k == "budget":
            v = _count("budget", v, 1, allow_none=True)
        elif k in ("n_sink", "n_local"):
            v = _count(k, v, 0)
        elif k == "seed":
            v = _count("seed", v, 0)
        elif k == "group_selection":
            g = getattr(v, "name", v)
            if not isinstance(g, str) or g.lower() not in GROUP_SELECTIONS:
                raise invalid("group_selection=%r is not one of %s" % (v, ", ".join(GROUP_SELECTIONS)))
            v = g.lower()
        out[k] = v
    return out


def library_kwargs(p: dict) -> dict:
    """The keyword arguments of ssa.Session.decode for these parameters."""
    return dict(method=p["method"], sparsity=p["sparsity"], budget=p["budget"], heavy_fraction=p["h"],
                n_sink=p["n_sink"], n_local=p["n_local"], seed=p["seed"],
                group_selection=p.get("group_selection", "off"))


def check_backend(backend):
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise invalid("backend=%r is not one of %s" % (backend, ", ".join(BACKENDS)))
    return backend.lower()
