#!/usr/bin/env bash
# Tuning sweep on the GPU host, from a gpu-bundle/ folder holding the bench: one bench run
# per line of a configs file (environment knobs, e.g. `FUSED_CE_SPLIT_LOADS=8`), case and
# modes narrowed by CASE / MODES. Usage there: gpu-bundle/sweep.sh configs.txt
cd "$(dirname "$0")"
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done; chmod +x throughput
export FUSED_CE_BENCH_SKIP_STOCK=1 FUSED_CE_BENCH_CASE=${CASE:-8192x128256}
export FUSED_CE_BENCH_MODE=${MODES:-"fwd,fwd+bwd,fwd+bwd other-plan"}
while read -r config; do
  [ -z "$config" ] && continue
  echo "== $config"
  env $config timeout 60 ./throughput --bench 2>&1 | grep -E "^[0-9]+x"
done < "${1:-configs.txt}"
