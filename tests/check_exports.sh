#!/usr/bin/env bash
# Fails if the shared library exports any symbol not starting with ssa_.
set -euo pipefail
lib="$1"
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /[TDBRVW]/ {print $3}' | grep -v '^ssa_' || true)
if [ -n "$bad" ]; then
  echo "unexpected exported symbols in $lib:"; echo "$bad"; exit 1
fi
count=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -c '^ssa_')
echo "ok: $count ssa_* symbols exported, nothing else"
[ "$count" -ge 20 ]
