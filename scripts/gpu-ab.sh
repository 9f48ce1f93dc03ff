#!/usr/bin/env bash
# A/B on a GPU host: the bench of two or more bundle folders (e.g. gpu-bundle and a copy
# of an earlier build), alternated, twice each, so that drift between runs shows.
#
#   gpu-bundle/ab.sh gpu-bundle-old gpu-bundle      (CASE / MODES as sweep.sh)
export FUSED_CE_BENCH_SKIP_STOCK=1 FUSED_CE_BENCH_CASE=${CASE:-8192x128256}
export FUSED_CE_BENCH_MODE=${MODES:-"fwd,fwd+bwd one-pass unchecked,fwd+bwd two-pass unchecked"}
export FUSED_CE_BENCH_OUT=${FUSED_CE_BENCH_OUT:-/tmp/fused-ce-ab}
for d in "$@"; do (cd "$d" && for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done; chmod +x throughput); done
for round in 1 2; do
  for d in "$@"; do
    echo "== $d round $round"
    (cd "$d" && ./throughput --bench 2>&1 | grep -E "^[0-9]+x|copy bandwidth")
  done
done
