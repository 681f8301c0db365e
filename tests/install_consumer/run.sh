#!/usr/bin/env bash
# Installs a built libssa into a temporary prefix and builds two consumers
# against it: one with CMake's find_package(ssa), one with pkg-config.
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$here" -B "$prefix/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" >/dev/null
LD_LIBRARY_PATH="$prefix/lib" "$prefix/consumer-build/consumer"
pc_dir="$(dirname "$(find "$prefix" -name ssa.pc | head -n1)")"
cc "$here/consumer.c" -o "$prefix/consumer-pc" $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs ssa) \
  -Wl,-rpath,"$(PKG_CONFIG_PATH="$pc_dir" pkg-config --variable=libdir ssa)"
"$prefix/consumer-pc"
