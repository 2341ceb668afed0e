#!/usr/bin/env bash
# Builds and runs the tests: the whole suite in the default build (GCC); under AddressSanitizer +
# UndefinedBehaviorSanitizer (clang-14), the tests of the core and of the report files, the C header's layout
# test, and each libFuzzer target for a bounded time (scripts/fuzz.sh). Prints how long each part took.
#   scripts/test.sh                   what CI runs (.ci/run, on a clean clone of a 2-core machine)
#   scripts/test.sh --all-sanitized   the same, with the whole suite, every label, under the sanitizers
# CI has 90 minutes and the aim is 25 on the slowest 2-core machine it has had (docs/testing.md has every measured
# run). On that machine the whole suite under the sanitizers was 2,000 of the 4,200 CPU seconds of a clean clone
# (36 minutes): the sanitizer tree of every library, the zoo and the command line, then every test again, 7x slower.
# CI's sanitizer stage is what reads from outside and the core under it: the fuzz targets (the exec: protocol
# both ways, the counterexample and corpus readers, the report writers), the report files' tests and the core's
# (attention_test: every dtype, stride, page table and mask the core reads through), labelled asan-ci; it builds
# only what they need (no zoo, no command line, no test of the laws). --all-sanitized runs the rest, whose
# memory and UB errors would be our own code on our own inputs: before a release, and after a change to memory
# handling (a plug-in's buffers, the worker, the streamed kernels).
#
# What --all-sanitized cuts, to fit (ASan + UBSan at -O1 runs the laws about 7x slower than the default
# build, which runs everything in full):
#   - built at -O1 with line tables only (-g1): ASan and UBSan reports still name file and line;
#   - RapidCheck properties run 10 cases instead of 100 (the asan test preset's RC_PARAMS=max_success=10);
#   - the law runs of the examples and plug-ins (attncheck_add_laws in examples/ and harness/tests/) run 5
#     cases per law instead of 20 or 30 (attncheck_test_cases in cmake/attncheckTesting.cmake), all laws of
#     one implementation in one test (ATTNCHECK_LAWS_ONE_TEST: one start-up of the runner and the implementation);
#   - the kill tests (mutants/tests/kill_test.cpp) are not built: whether a law kills a mutant and shrinks it to
#     its minimal case, and whether a control holds, is the default build's question; the code they run (every
#     law, shrinking, every zoo kernel) runs under the sanitizers in Zoo.everyEntryRunsOnDrawnCasesOfWhatItDeclares
#     (each zoo entry on drawn cases of everything it declares, forward and backward, at every dtype), the law
#     and generator tests and every implementation's law runs;
#   - no benchmarks are built (ATTNCHECK_BENCH=OFF in the asan preset), nor the kill-matrix command;
#   - Examples.regeneratedReportsAreByteIdentical is skipped (byte identity is the default build's question;
#     the report writers run under the sanitizers in the cli and reports tests);
#   - what the sanitizers cannot find a defect of ours in is not run there: the pages in headless Chromium (the
#     browser is not our code; the runs that made its pages took three minutes), the pytest plugin and two of the
#     three PyTorch examples (Python; the exec: frames they send, the numpy examples send too), the installed
#     package's consumer project (the same sources again, built a second time);
#   - the tests of a whole run's plumbing (every law through the command, parallel jobs equal to serial) run 5
#     cases a law (cli/tests/cli_test.cpp, run_cases).
# One sanitizer tree for the suite and the fuzzers (clang-14, which libFuzzer needs): a separate fuzz tree
# compiled the core, the laws, the harness and the reports a third time. libFuzzer's hooks go into the harness
# and reports libraries alone (attncheck_fuzz_hooks in CMakeLists.txt), the code the fuzzers are for.
# CI's sanitizer stage compiles the laws' library at -O0 (ATTNCHECK_SANITIZE_LAWS_O0): its tests and fuzzers link
# it but run little of it (--all-sanitized runs the laws, and keeps -O1).
# The default preset compiles with line tables only (-g1): full debug info made the builds half again slower.
# What keeps the builds short: sources two targets need are compiled once (OBJECT libraries: the harness's
# shared sources, the tests' main()); the libraries with many small sources (attncheck::properties,
# attncheck::mutants) and the test executables with several compile against a precompiled header of Eigen,
# RapidCheck or GoogleTest and the standard headers (cmake/attncheckTesting.cmake); attncheck::mutants and
# attncheck::reports compile as a few unity sources each (the same Eigen and JSON templates instantiated once per
# unity source, not once per file: about half their CPU), and the laws of attncheck::properties as 4 (each law's
# names in a namespace of its own). The presets use Ninja: a target's sources compile while the libraries it links
# are still being built. On a clean clone ctest has
# no timings of an earlier run, so the longest tests carry a COST (the kill tests, the hanging and pytest
# examples, the consumer) and start first: on 2 cores, a long test started last would be the tail of the run.
# Each stage's build and test times are printed, and all of them again at the end; docs/testing.md
# ("Tests, sanitizers and fuzzing") gives the figures measured on a clean clone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
all_sanitized=0
case "${1:-}" in
  "") ;;
  --all-sanitized) all_sanitized=1 ;;
  *) echo "scripts/test.sh: expected no argument or --all-sanitized, got '$1'" >&2; exit 2 ;;
esac

scripts/setup.sh
jobs=$(nproc)
# One compile job more than the cores (a core otherwise idles while a job links or waits on a precompiled header),
# and two more tests than the cores (some tests wait on timeouts and child processes): every stage of CI's run
# kept both cores about 95% busy at one job per core and one test more.
build_jobs=$((jobs + 1))
# ccache (when CMAKE_CXX_COMPILER_LAUNCHER names it) caches the sources compiled against a precompiled header
# only with this sloppiness; CI runs without ccache.
if [[ "${CMAKE_CXX_COMPILER_LAUNCHER:-}" == *ccache* ]]; then
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:+$CCACHE_SLOPPINESS,}pch_defines,time_macros"
fi
# Each part's wall time and the CPU time (user + system) of the processes it ran: on a machine shared with other
# work the wall time grows, the CPU time hardly does.
cpu_file=$(mktemp)
trap 'rm -f "$cpu_file"' EXIT
cpu() {  # CPU seconds of every finished child so far, from bash's `times` (run in this shell, not a subshell)
  local user sys
  times > "$cpu_file"
  read -r user sys < <(tail -1 "$cpu_file")
  cpu_now=$(awk -v u="$user" -v s="$sys" 'function sec(t,  m) { m = t; sub(/m.*/, "", m); sub(/^[0-9]+m/, "", t);
                                          sub(/s$/, "", t); return m * 60 + t } BEGIN { printf "%d", sec(u) + sec(s) }')
}
times=()
part() {
  cpu
  local took=$(( SECONDS - start )) used=$(( cpu_now - cpu_start ))
  echo "== $1 took ${took}s (CPU ${used}s)"
  times+=("$(printf '%-20s %5ss wall %6ss CPU' "$1" "$took" "$used")")
  start=$SECONDS
  cpu_start=$cpu_now
}
start=$SECONDS
all=$SECONDS
cpu
cpu_start=$cpu_now

echo "== default build: all tests"
cmake --preset default >/dev/null
cmake --build --preset default -j"$build_jobs"
part "default build"
ctest --preset default -j"$((jobs + 2))"
part "default tests"

# The laws' library at -O0 where only CI's subset runs (ATTNCHECK_SANITIZE_LAWS_O0, CMakeLists.txt).
cmake --preset asan -DATTNCHECK_SANITIZE_LAWS_O0="$(( 1 - all_sanitized ))" >/dev/null
if [[ "$all_sanitized" == 1 ]]; then
  echo "== asan build: the whole suite and the fuzz targets under ASan + UBSan"
  cmake --build --preset asan -j"$build_jobs"
  part "asan build"
  ctest --preset asan -j"$((jobs + 1))"
else
  echo "== asan build: the core's and the report files' tests and the fuzz targets under ASan + UBSan"
  cmake --build --preset asan -j"$build_jobs" --target asan-ci  # those tests and the fuzz targets (CMakeLists.txt)
  part "asan build"
  ctest --preset asan -j"$((jobs + 1))" -L asan-ci
fi
part "asan tests"

echo "== fuzz: each target for ${ATTNCHECK_FUZZ_SECONDS:-10}s"
scripts/fuzz.sh "${ATTNCHECK_FUZZ_SECONDS:-10}"
part "fuzz runs"

echo "== times"
printf '%s\n' "${times[@]}"
cpu
printf '%-20s %5ss wall %6ss CPU\n' "all" "$(( SECONDS - all ))" "$cpu_now"
