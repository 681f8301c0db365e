#!/usr/bin/env bash
# Installs a built libssa into a temporary prefix and builds two consumers
# against it: one with CMake's find_package(ssa), one with pkg-config. Both run
# as users run them: without LD_LIBRARY_PATH or an rpath of their own.
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$here" -B "$prefix/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" >/dev/null
env -u LD_LIBRARY_PATH "$prefix/consumer-build/consumer"
pc_dir="$(dirname "$(find "$prefix" -name ssa.pc | head -n1)")"
cc "$here/consumer.c" -o "$prefix/consumer-pc" $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs ssa)
env -u LD_LIBRARY_PATH "$prefix/consumer-pc"
# Statically linked through pkg-config --static: no libssa.so needed at run time.
cc "$here/consumer.c" -o "$prefix/consumer-static" $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags ssa) \
  "$(PKG_CONFIG_PATH="$pc_dir" pkg-config --variable=libdir ssa)/libssa.a" \
  $(PKG_CONFIG_PATH="$pc_dir" pkg-config --static --libs ssa | sed 's/-lssa//')
if ldd "$prefix/consumer-static" | grep -q libssa; then
  echo "consumer-static still loads libssa.so" >&2
  exit 1
fi
env -u LD_LIBRARY_PATH "$prefix/consumer-static"
