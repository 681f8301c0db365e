#!/usr/bin/env bash
# Builds the snapshot loader fuzzers with clang (libFuzzer + ASan/UBSan) and runs
# each for half of SECONDS on a copy of the seed corpus: byte-level mutations and
# structure-aware ones (checksums resealed), side by side when JOBS >= 2, else one
# after the other. Prints one summary line per fuzzer; the full libFuzzer logs
# stay in $build/fuzz-logs. A crash, leak or sanitizer report fails the script
# and prints the end of its log.
#   fuzz/run_fuzzer.sh [SECONDS=60] [JOBS=2]
set -euo pipefail
seconds=${1:-60}
jobs=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
build=${SSA_FUZZ_BUILD:-$here/../build-fuzz}
mkdir -p "$build"
build=$(cd "$build" && pwd)
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install -y clang libclang-rt-14-dev)" >&2; exit 2; }
# Line tables only (-g1): all a crash report names, in less compile time than -g.
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" >/dev/null
ninja -C "$build" -j "$jobs" snapshot_load_fuzzer snapshot_struct_fuzzer make_corpus >"$build/fuzz-build.log" 2>&1 ||
  { tail -n 40 "$build/fuzz-build.log" >&2; exit 1; }
logs="$build/fuzz-logs"
mkdir -p "$logs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
half=$(( seconds / 2 > 0 ? seconds / 2 : 1 ))

# fuzz NAME: runs one fuzzer for $half seconds; its exit code in $logs/NAME.rc.
fuzz() {
  local fuzzer="$1" corpus="$work/$1" log="$logs/$1.log" rc=0
  mkdir -p "$corpus"
  cp "$here"/corpus/* "$corpus"/ 2>/dev/null || "$build/make_corpus" "$corpus" >/dev/null
  rm -f "$logs/$fuzzer-"*
  ( cd "$work" && ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
      "$build/$fuzzer" "$corpus" -max_total_time="$half" -rss_limit_mb=2048 \
      -max_len=262144 -timeout=10 -print_final_stats=1 -artifact_prefix="$logs/$fuzzer-" ) >"$log" 2>&1 || rc=$?
  echo "$rc" >"$logs/$fuzzer.rc"
}

fuzzers=(snapshot_load_fuzzer snapshot_struct_fuzzer)
for fuzzer in "${fuzzers[@]}"; do rm -f "$logs/$fuzzer.rc"; done
if [ "$jobs" -ge 2 ]; then
  for fuzzer in "${fuzzers[@]}"; do fuzz "$fuzzer" & done
  wait
else
  for fuzzer in "${fuzzers[@]}"; do fuzz "$fuzzer"; done
fi

failed=0
for fuzzer in "${fuzzers[@]}"; do
  log="$logs/$fuzzer.log"
  rc=$(cat "$logs/$fuzzer.rc")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  crashes=$(find "$logs" -maxdepth 1 -name "$fuzzer-*" | wc -l)
  echo "$fuzzer: ${half}s, runs ${runs:-?}, coverage ${cov:-?} edges / ${ft:-?} features, corpus ${corp:-?}, crashes $crashes, exit $rc (log: $log)"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    echo "== $fuzzer FAILED; end of its log:" >&2
    tail -n 60 "$log" >&2
    failed=1
  fi
done
exit "$failed"
