#!/usr/bin/env bash
# Builds the libFuzzer targets (in the `asan` preset's tree: clang-14, ASan + UBSan, the sanitizer stage's tests
# beside them) and runs each for a bounded time from its checked-in seeds (fuzz/corpus/). A crash leaves its
# input in build/asan/findings/ and fails.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
#   scripts/fuzz.sh --build-only            (builds the targets, runs none: scripts/test.sh times the two apart)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-30}

cmake --preset asan >/dev/null
cmake --build --preset asan -j"$(nproc)" --target fuzz_protocol_parent fuzz_protocol_child fuzz_counterexample fuzz_corpus \
  fuzz_report_writers
[ "$seconds" = --build-only ] && exit 0

findings=build/asan/findings
mkdir -p "$findings"
# One target: its own scratch folder for new inputs (the checked-in seeds stay as they are), its log.
fuzz_one() {
  local target=$1 seeds=$2 scratch
  scratch=$(mktemp -d)
  echo "== fuzz: $target for ${seconds}s from $seeds"
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      build/asan/fuzz/"$target" "$scratch" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=16384 -artifact_prefix="$findings/$target-" -print_final_stats=1 >"$findings/$target.log" 2>&1; then
    echo "FAILED: $target (its log: $findings/$target.log; the input: $findings/$target-*)"
    tail -40 "$findings/$target.log"
    rm -rf "$scratch"
    return 1
  fi
  grep -E "^stat::number_of_executed_units|^Done" "$findings/$target.log" | sed "s/^/$target: /" || true
  rm -rf "$scratch"
}

# The targets are single-threaded: as many at once as there are cores.
status=0
running=0
for pair in fuzz_protocol_parent:protocol_parent fuzz_protocol_child:protocol_child \
            fuzz_counterexample:counterexample fuzz_corpus:counterexample fuzz_report_writers:report_writers; do
  fuzz_one "${pair%%:*}" "fuzz/corpus/${pair#*:}" &
  running=$((running + 1))
  if [ "$running" -ge "$(nproc)" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
exit $status
