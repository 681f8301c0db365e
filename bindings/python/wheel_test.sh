#!/usr/bin/env bash
# CI step of the wheel: builds the CPU wheel (scripts/build_wheel.sh), then in a
# fresh venv installs it from local files only and runs the binding's tests, on a
# machine made to look like one without Abseil, xxHash or a compiler: inside a
# private mount namespace, /dev/null is mounted over every libabsl* and libxxhash*
# file and every C/C++ compiler, and an empty folder over /usr/include. (Where
# mount namespaces are not allowed it runs without hiding them and says so; the
# check below that every Abseil/xxHash library mapped into the process comes from
# the wheel runs either way.) Prints the wheel's size and the install + import time.
# SSA_WHEEL=FILE tests that wheel instead of building one.
# Also checks that `pip install ./bindings/python` on a machine without Abseil
# stops with the one-line message naming the packages.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

if [ -n "${SSA_WHEEL:-}" ]; then
  WHL="$SSA_WHEEL"   # a wheel built before (scripts/build_wheel.sh)
else
  bash "$ROOT/scripts/build_wheel.sh" "$WORK/dist"
  WHL="$(ls "$WORK"/dist/cpu/ssa-*.whl)"
fi
echo "wheel: $(basename "$WHL"): $(du -k "$WHL" | cut -f1) KiB"

# The wheel's dependencies as local files (from pip's cache when there): the timed
# install below reads nothing but local files.
"$PY" -m pip download -q -d "$WORK/deps" numpy cffi pytest
"$PY" -m venv "$WORK/venv"

cat > "$WORK/in_bare_machine.sh" <<'EOF'
set -euo pipefail
WORK="$1"; WHL="$2"; ROOT="$3"; hidden="$4"
unset PYTHONPATH PYTHONHOME LD_LIBRARY_PATH  # the venv and the wheel alone
VPY="$WORK/venv/bin/python"
t0=$EPOCHREALTIME
"$VPY" -m pip install -q --no-index --find-links "$WORK/deps" "$WHL"
"$VPY" -c "import ssa; ssa.Runtime(backend='cpu').close()"
t1=$EPOCHREALTIME
echo "install + import from local files: $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s ($hidden)"
"$VPY" -m pip install -q --no-index --find-links "$WORK/deps" pytest
# Outside the source tree: its ssa/ has no compiled parts.
cd "$WORK"
"$VPY" - <<'PY'
import numpy as np, ssa
rng = np.random.default_rng(0)
with ssa.Runtime(backend="cpu") as rt, rt.create_session(1, 4, 2, 64, "float32") as s:
    s.append(0, rng.standard_normal((5000, 2, 64)).astype(np.float32), rng.standard_normal((5000, 2, 64)).astype(np.float32))
    out, st = s.decode(0, rng.standard_normal((4, 64)).astype(np.float32), sparsity=10, stats=True)
    assert st.heavy_tokens > 0 and st.draws > 0
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libabsl" in l or "libxxhash" in l or "libssa" in l})
outside = [l for l in libs if "/site-packages/" not in l]
print("libraries of libssa mapped: %d, all from the wheel: %s" % (len(libs), not outside))
assert libs and not outside, outside
PY
"$VPY" -m pytest -q -p no:cacheprovider "$ROOT/bindings/python/tests"
EOF

hide() {
  mount -t tmpfs none /usr/include
  for f in /usr/lib/*/libabsl* /usr/lib/*/libxxhash* /usr/lib/libxxhash* /usr/local/lib/libabsl* \
           /usr/bin/*gcc* /usr/bin/*g++* /usr/bin/cc /usr/bin/c++ /usr/bin/clang* /usr/bin/nvcc; do
    [ -e "$f" ] && [ ! -L "$f" ] && mount --bind /dev/null "$f"
  done
  return 0
}
export -f hide
if unshare -m --propagation private true 2>/dev/null; then
  unshare -m --propagation private bash -c 'set -e; hide
    if g++ --version >/dev/null 2>&1 || cc --version >/dev/null 2>&1; then echo "a compiler is still visible" >&2; exit 1; fi
    for f in /usr/lib/*/libabsl_base.so.* /usr/lib/*/libxxhash.so.*; do
      if [ -e "$f" ] && [ "$(head -c 4 "$f" | wc -c)" != 0 ]; then echo "$f is still readable" >&2; exit 1; fi
    done
    bash "$0" "$1" "$2" "$3" "no Abseil, xxHash, compiler or headers visible"' \
    "$WORK/in_bare_machine.sh" "$WORK" "$WHL" "$ROOT"
else
  echo "wheel_test.sh: mount namespaces are not allowed here: the system's Abseil, xxHash and compiler stay visible"
  bash "$WORK/in_bare_machine.sh" "$WORK" "$WHL" "$ROOT" "system libraries visible"
fi

# Without the C++ dependencies, a source install stops with one line naming them.
log="$WORK/source_install.log"
if "$PY" -m pip install --no-build-isolation --no-deps --target "$WORK/t" \
    -C cmake.define.CMAKE_DISABLE_FIND_PACKAGE_absl=TRUE -C build-dir="$WORK/b" "$ROOT/bindings/python" >"$log" 2>&1; then
  echo "wheel_test.sh: a source install without Abseil did not fail" >&2; exit 1
fi
grep -q "building libssa needs Abseil (libabsl-dev): apt-get install" "$log" || {
  cat "$log" >&2; echo "wheel_test.sh: no clear message naming the missing packages" >&2; exit 1; }
echo "source install without Abseil stops with: $(grep -o 'building libssa needs.*' "$log" | head -1)"
