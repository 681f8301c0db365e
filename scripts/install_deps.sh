#!/usr/bin/env bash
# Installs the build and test dependencies from Debian's packages (skipping what
# is already there). Safe to run repeatedly.
set -euo pipefail
need=()
for pkg in cmake g++ make pkg-config libabsl-dev libxxhash-dev doctest-dev python3 python3-pip valgrind; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${SSA_WITH_BINDINGS:-0}" = "1" ]; then
  for pkg in golang-go bindgen cargo rustc; do
    if ! command -v "${pkg%%-*}" >/dev/null 2>&1 && ! dpkg -s "$pkg" >/dev/null 2>&1; then need+=("$pkg"); fi
  done
fi
if [ "${SSA_WITH_FUZZ:-0}" = "1" ]; then
  for pkg in clang libclang-rt-14-dev ninja-build; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
