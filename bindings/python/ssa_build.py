"""cffi builder for ssa._ssa_cffi. Used by setup.py; see its docstring for the environment."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def _dir(env, default_rel):
    value = os.environ.get(env)
    path = os.path.abspath(value if value else os.path.join(HERE, default_rel))
    return path


LIB_DIR = _dir("SSA_LIB_DIR", os.path.join("..", "..", "build"))
INCLUDE_DIR = _dir("SSA_INCLUDE_DIR", os.path.join("..", "..", "include"))

if not os.path.exists(os.path.join(INCLUDE_DIR, "ssa.h")):
    raise RuntimeError("ssa.h not found in %s: set SSA_INCLUDE_DIR" % INCLUDE_DIR)
if not any(n.startswith("libssa.so") or n in ("libssa.dylib", "ssa.lib", "libssa.a")
           for n in (os.listdir(LIB_DIR) if os.path.isdir(LIB_DIR) else [])):
    raise RuntimeError("libssa not found in %s: build it first or set SSA_LIB_DIR" % LIB_DIR)

with open(os.path.join(HERE, "ssa", "_cdef.h"), encoding="utf-8") as f:
    CDEF = f.read()

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "ssa._ssa_cffi",
    '#include "ssa.h"\n',
    include_dirs=[INCLUDE_DIR],
    library_dirs=[LIB_DIR],
    libraries=["ssa"],
    extra_link_args=["-Wl,-rpath," + LIB_DIR],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
