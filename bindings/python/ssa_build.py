"""cffi builder of ssa._ssa_cffi (out-of-line API mode).

CMakeLists.txt runs ``python ssa_build.py --emit FILE.c`` to write the extension's C
source, which CMake then compiles against ssa.h and links with libssa. Running it
with no arguments compiles the extension in place against ../../build (SSA_LIB_DIR /
SSA_INCLUDE_DIR override both), for quick work on the binding itself.
"""
import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def builder(include_dir=None, lib_dir=None):
    with open(os.path.join(HERE, "ssa", "_cdef.h"), encoding="utf-8") as f:
        cdef = f.read()
    ffi = FFI()
    ffi.cdef(cdef)
    kw = {}
    if lib_dir:
        kw = dict(include_dirs=[include_dir], library_dirs=[lib_dir], libraries=["ssa"],
                  extra_link_args=["-Wl,-rpath," + lib_dir])
    ffi.set_source("ssa._ssa_cffi", '#include "ssa.h"\n', **kw)
    return ffi


def main(argv):
    if len(argv) == 2 and argv[0] == "--emit":
        builder().emit_c_code(argv[1])
        return 0
    if argv:
        sys.stderr.write("usage: ssa_build.py [--emit FILE.c]\n")
        return 2
    lib_dir = os.path.abspath(os.environ.get("SSA_LIB_DIR") or os.path.join(HERE, "..", "..", "build"))
    inc_dir = os.path.abspath(os.environ.get("SSA_INCLUDE_DIR") or os.path.join(HERE, "..", "..", "include"))
    # Built in a scratch folder (setuptools refuses a folder holding several
    # packages), then put beside the package's sources.
    import glob
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        built = builder(inc_dir, lib_dir).compile(tmpdir=tmp, verbose=True)
        for old in glob.glob(os.path.join(HERE, "ssa", "_ssa_cffi*.so")):
            os.remove(old)
        shutil.copy(built, os.path.join(HERE, "ssa", os.path.basename(built)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
