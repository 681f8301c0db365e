#!/usr/bin/env bash
# Builds the snapshot loader fuzzer with clang (libFuzzer + ASan/UBSan) and runs it
# for a bounded time on a copy of the seed corpus.
#   fuzz/run_fuzzer.sh [SECONDS=60] [JOBS=2]
set -euo pipefail
seconds=${1:-60}
jobs=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
build=${SSA_FUZZ_BUILD:-$here/../build-fuzz}
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install -y clang libclang-rt-14-dev)" >&2; exit 2; }
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
ninja -C "$build" -j "$jobs" snapshot_load_fuzzer make_corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here"/corpus/* "$work"/ 2>/dev/null || "$build/make_corpus" "$work"
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  "$build/snapshot_load_fuzzer" "$work" -max_total_time="$seconds" -rss_limit_mb=2048 \
  -max_len=262144 -timeout=10 -print_final_stats=1
