#!/usr/bin/env bash
# The main job: sets up, builds attncheck, checks the reference (every law holds) and one mutant of the zoo
# (laws are falsified and counterexample reports written), then shows one report. Any arguments are passed
# to the attncheck command instead (for example: scripts/run.sh list, scripts/run.sh demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target attncheck >/dev/null
bin=build/default/cli/attncheck
[ $# -eq 0 ] || exec "$bin" "$@"

# Reports go under build/ (ignored by git). --force: each run of this script replaces the previous one's.
reports=build/attncheck-reports
mutant=mutant:mask-zero
law=zero-future-weight

echo "\$ attncheck check --impl reference"
"$bin" check --impl reference --report-dir "$reports/reference" --corpus "$reports/corpus" --force

echo
echo "\$ attncheck check --impl $mutant"
rc=0
"$bin" check --impl "$mutant" --report-dir "$reports/${mutant/:/-}" --corpus "$reports/corpus" --force || rc=$?
if [ "$rc" -ne 1 ]; then
  echo "run.sh: expected exit code 1 (laws falsified) from the mutant, got $rc" >&2
  exit 1
fi

echo
echo "\$ cat $reports/${mutant/:/-}/$law.md"
cat "$reports/${mutant/:/-}/$law.md"
