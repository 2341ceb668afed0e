#!/usr/bin/env bash
# Builds and runs every test: the whole suite in the default build; the whole suite again, every label, under
# AddressSanitizer + UndefinedBehaviorSanitizer; then each libFuzzer target for a bounded time
# (scripts/fuzz.sh). Prints how long each part took. CI (.ci/run) runs this on a clean clone of a 2-core
# machine and must finish within 30 minutes.
#
# What the sanitizer pass cuts, to fit (ASan + UBSan at -O1 runs the laws about 7x slower than the default
# build, which runs everything in full):
#   - built at -O1 with line tables only (-g1): ASan and UBSan reports still name file and line;
#   - RapidCheck properties run 10 cases instead of 100 (the asan test preset's RC_PARAMS=max_success=10);
#   - the law runs of the examples and plug-ins (attncheck_add_laws in examples/ and harness/tests/) run 5
#     cases per law instead of 40 or 60 (attncheck_test_cases in cmake/attncheckTesting.cmake);
#   - the kill tests (mutants/tests/kill_test.cpp, under ATTNCHECK_SANITIZED): each mutant's fixed-seed kill
#     runs only its own laws (and those that must hold on it) and skips the smallest-case-over-every-law
#     check; the seed sweeps run 1 seed instead of 20 (mutants) and 10 (controls); the controls run 10 cases
#     per law instead of 100 (every dtype) and 25 (other seeds);
#   - Examples.regeneratedReportsAreByteIdentical is skipped (byte identity is the default build's question;
#     the report writers run under the sanitizers in the cli and reports tests).
# Every other test runs, every label included. The consumer example is built with the sanitizers as well.
# The default preset compiles with line tables only (-g1): full debug info made the builds half again slower.
# Each part's time is printed; the README's "Tests, sanitizers and fuzzing" gives the figures measured on a
# clean clone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
jobs=$(nproc)
part() { echo "== $1 took $(( SECONDS - start ))s"; start=$SECONDS; }
start=$SECONDS

echo "== default build: all tests"
cmake --preset default >/dev/null
cmake --build --preset default -j"$jobs"
ctest --preset default -j"$((jobs + 1))"  # one more than the cores: some tests wait on timeouts and child processes
part "default build and tests"

echo "== asan build: all tests under ASan + UBSan"
cmake --preset asan >/dev/null
cmake --build --preset asan -j"$jobs"
ctest --preset asan -j"$((jobs + 1))"
part "asan build and tests"

echo "== fuzz: each target for ${ATTNCHECK_FUZZ_SECONDS:-20}s"
scripts/fuzz.sh "${ATTNCHECK_FUZZ_SECONDS:-20}"
part "fuzzing"
