#!/usr/bin/env bash
# Builds and runs every test: the whole suite in the default build, then the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
jobs=$(nproc)

echo "== default build: all tests"
cmake --preset default >/dev/null
cmake --build --preset default -j"$jobs"
ctest --preset default -j"$jobs"

echo "== asan build: unit tests under ASan + UBSan"
cmake --preset asan >/dev/null
# Only the executables that hold unit tests: the asan preset's test filter runs label `unit`.
cmake --build --preset asan -j"$jobs" --target attention_test reports_test cli_test mutants_test plugin_abi_test
ctest --preset asan -j"$jobs"
