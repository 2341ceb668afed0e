#!/usr/bin/env bash
# Regenerates reports/examples/: what `attncheck check` writes for a few mutants of the zoo and one control, at
# the default seed and settings. From the repository root, after building:
#   reports/make-examples.sh build/default/cli/attncheck
# The examples test runs this into a scratch folder and checks every file comes out byte-identical.
set -euo pipefail
bin=${1:-build/default/cli/attncheck}
out=${2:-reports/examples}

# A leak (heatmap), the scale (variance plot), a bug in one head, NaN from an additive mask (non-finite
# numbers in JSON), state kept between calls, a query head reading the wrong kv head (grouped queries), a
# decode step reading the KV cache one slot off, a tiled kernel shrunk to one query over two key tiles, a
# backward that leaks gradient to future keys (dO, expected and actual gradients), a sink added to every
# numerator (a case with sinks and the LSE), a packed document starting one key early (document bounds), and a correct control (a summary where every law holds).
impls=(mutant:mask-zero mutant:scale-forgotten mutant:mask-head0-only mutant:additive-nan-leak
       mutant:stale-accumulator mutant:gqa-kv-modulo mutant:decode-cache-off-by-one mutant:tiled-inverted-rescale
       mutant:grad-ds-unmasked mutant:sink-every-numerator mutant:document-start-off-by-one control:online-tiled)

for impl in "${impls[@]}"; do
  want=1
  [[ $impl == control:* ]] && want=0
  rc=0
  # --force: replacing the previous examples is the point; --no-corpus: each example is a fresh run.
  "$bin" check --impl "$impl" --report-dir "$out/${impl/:/-}" --no-corpus --force >/dev/null || rc=$?
  if [[ $rc -ne $want ]]; then
    echo "make-examples: attncheck check --impl $impl exited $rc, expected $want" >&2
    exit 1
  fi
done
echo "examples written to $out/"
