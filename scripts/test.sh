#!/usr/bin/env bash
# Builds and runs every test: the whole suite in the default build, the whole suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer (fewer RapidCheck cases: the asan test preset's RC_PARAMS),
# then each libFuzzer target for a bounded time (scripts/fuzz.sh). Prints how long each part took.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
jobs=$(nproc)
part() { echo "== $1 took $(( SECONDS - start ))s"; start=$SECONDS; }
start=$SECONDS

echo "== default build: all tests"
cmake --preset default >/dev/null
cmake --build --preset default -j"$jobs"
ctest --preset default -j"$jobs"
part "default build and tests"

echo "== asan build: all tests under ASan + UBSan"
cmake --preset asan >/dev/null
cmake --build --preset asan -j"$jobs"
ctest --preset asan -j"$jobs"
part "asan build and tests"

echo "== fuzz: each target for ${ATTNCHECK_FUZZ_SECONDS:-30}s"
scripts/fuzz.sh "${ATTNCHECK_FUZZ_SECONDS:-30}"
part "fuzzing"
