"""Builds the cffi extension ssa._ssa_cffi (out-of-line API mode) against libssa.

Environment:
  SSA_LIB_DIR      directory holding libssa.so (default: ../../build relative to this file)
  SSA_INCLUDE_DIR  directory holding ssa.h   (default: ../../include relative to this file)
The extension is linked with an rpath to SSA_LIB_DIR, so it finds libssa.so at run
time without LD_LIBRARY_PATH.
"""
from setuptools import setup

# Always rebuild the extension: its rpath and the header it compiles against come from
# the environment, which setuptools' up-to-date check cannot see.
setup(cffi_modules=["ssa_build.py:ffibuilder"], options={"build_ext": {"force": True}})
