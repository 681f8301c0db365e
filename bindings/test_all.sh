#!/usr/bin/env bash
# Checks and tests every language binding against a built libssa.
#
#   bindings/test_all.sh [BUILD_DIR]        (default: $SSA_BUILD_DIR, else build)
#
# BUILD_DIR is a CMake build directory of this repository holding libssa.so, e.g.
#   cmake -S . -B build -DSSA_ENABLE_CUDA=OFF && cmake --build build -j2
# Installs what it needs (pip: cffi numpy pytest setuptools wheel scikit-build-core; apt: golang-go
# bindgen), then runs: bindings/generate --check, pytest, cargo test (offline),
# go vet + go test, and the three examples, all without LD_LIBRARY_PATH. Any
# failure stops it with a non-zero exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-${SSA_BUILD_DIR:-build}}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
step() { printf '\n==== %s\n' "$*"; }
fail() { printf 'bindings/test_all.sh: %s\n' "$*" >&2; exit 1; }

[ -e "$BUILD/libssa.so" ] || fail "no libssa.so in $BUILD (build libssa first or pass its build dir)"
BUILD="$(cd "$BUILD" && pwd)"
PY="${PYTHON:-python3}"

step "tools"
need_pip=()
for mod in cffi numpy pytest setuptools wheel scikit_build_core; do
  "$PY" -c "import $mod" 2>/dev/null || need_pip+=("$mod")
done
if [ "${#need_pip[@]}" -gt 0 ]; then
  "$PY" -m pip install -q "${need_pip[@]}"
fi
need_apt=()
command -v go >/dev/null || need_apt+=(golang-go)
command -v bindgen >/dev/null || need_apt+=(bindgen)
if [ "${#need_apt[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
command -v cargo >/dev/null || fail "cargo is missing (a Rust toolchain is required)"
go version; bindgen --version; cargo --version; "$PY" --version

step "generated bindings are up to date"
"$ROOT/bindings/generate" --check

TMPS=()
trap 'rm -rf "${TMPS[@]}"' EXIT

step "python"
export SSA_LIB_DIR="$BUILD" SSA_INCLUDE_DIR="$ROOT/include"
# Installed into a folder of its own (first on PYTHONPATH), not over the
# interpreter's site-packages.
PYTARGET="$(mktemp -d)"; TMPS+=("$PYTARGET")
"$PY" -m pip install -q --no-build-isolation --no-deps --target "$PYTARGET" "$ROOT/bindings/python"
# Run from the repository root so the source tree's ssa/ (without the compiled
# extension) does not shadow the installed package.
(cd "$ROOT" && PYTHONPATH="$PYTARGET" "$PY" -m pytest -q -p no:cacheprovider bindings/python/tests)
(cd "$ROOT" && PYTHONPATH="$PYTARGET" "$PY" examples/python/agent_session.py)

step "rust"
# Default: ssa-sys links libssa.a (the test binaries must not load libssa.so);
# then once more with the shared library (feature `dynamic`).
(cd "$ROOT/bindings/rust" && env -u LD_LIBRARY_PATH cargo test --offline -q)
(cd "$ROOT/bindings/rust" && env -u LD_LIBRARY_PATH cargo test --offline -q -p ssa --features dynamic)
(cd "$ROOT/examples/rust" && env -u LD_LIBRARY_PATH cargo run --offline -q --release)
EXE="$ROOT/examples/rust/target/release/agent_session"
if ldd "$EXE" | grep -q libssa; then fail "$EXE loads libssa.so; ssa-sys should link libssa.a"; fi

step "go"
PREFIX="$(mktemp -d)"; TMPS+=("$PREFIX")
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
PC="$(find "$PREFIX" -name ssa.pc | head -n1)"
[ -n "$PC" ] || fail "cmake --install put no ssa.pc under $PREFIX"
# ssa.pc is relocatable (prefix=${pcfiledir}/../..): no rewriting needed.
# ssa.pc's Libs carry the rpath: nothing else tells the programs where libssa.so is.
export PKG_CONFIG_PATH="$(dirname "$PC")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export GOPROXY=off GOFLAGS=-mod=mod
# Go's build cache does not key a cgo package on the flags pkg-config gave it:
# a second run would link against the previous run's (deleted) prefix. Its
# library folder in CGO_LDFLAGS (part of the key) makes each prefix a new build.
export CGO_LDFLAGS="-L$(dirname "$(dirname "$PC")")${CGO_LDFLAGS:+ $CGO_LDFLAGS}"
(cd "$ROOT/bindings/go" && go vet ./... && env -u LD_LIBRARY_PATH go test -count=1 ./...)
(cd "$ROOT/examples/go" && go vet . && env -u LD_LIBRARY_PATH go run .)

step "all binding checks passed"
