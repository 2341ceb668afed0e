#!/usr/bin/env bash
# The main job: sets up, builds attncheck and runs it. With no arguments it runs the demo; any arguments are
# passed to the attncheck command (for example: scripts/run.sh demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target attncheck >/dev/null

[ $# -gt 0 ] || set -- demo
exec build/default/cli/attncheck "$@"
