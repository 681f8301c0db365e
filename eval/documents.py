"""Real documents found on any Debian/Ubuntu machine with CPython, long enough
for 32K tokens of Gemma-3 context (and cut shorter for SmolLM2)."""
from __future__ import annotations

import os
import sysconfig

LICENSES = "/usr/share/common-licenses"


def _licenses() -> str:
    # Every licence text (not the symlinks), in name order, each under its name.
    names = sorted(n for n in os.listdir(LICENSES) if not os.path.islink(os.path.join(LICENSES, n)))
    return "\n\n".join("%s\n\n%s" % (n, open(os.path.join(LICENSES, n), encoding="utf-8", errors="replace").read())
                       for n in names)


def _pydoc_topics() -> str:
    # The Python language reference as plain text (what pydoc shows for keywords and topics).
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def _pydecimal() -> str:
    return open(os.path.join(sysconfig.get_paths()["stdlib"], "_pydecimal.py"), encoding="utf-8").read()


DOCS = {
    "licenses": ("%s/* (all licence texts, name order)" % LICENSES, _licenses),
    "pydoc_topics": ("pydoc_data.topics (Python language reference text)", _pydoc_topics),
    "pydecimal": ("%s/_pydecimal.py" % sysconfig.get_paths()["stdlib"], _pydecimal),
}


def text(name: str) -> str:
    return DOCS[name][1]()


def describe(name: str) -> str:
    return DOCS[name][0]
