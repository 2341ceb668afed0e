#!/bin/bash
# Submits the shards (an array) and the merge, sequenced: the merge starts when every shard task has ended,
# whatever its exit (afterany), and judges them all. Usage: IMPL=plugin:... OUT=/shared/attncheck slurm-submit.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${IMPL:?set IMPL}" "${OUT:?set OUT}"
mkdir -p "$OUT/shards" "$OUT/corpus"
rm -rf "$OUT"/shards/shard-* "$OUT/report"  # last time's shards are not this run's
array=$(sbatch --parsable --export=ALL "$here/slurm-shards.sbatch")
sbatch --parsable --export=ALL --dependency="afterany:${array%%;*}" "$here/slurm-merge.sbatch"
