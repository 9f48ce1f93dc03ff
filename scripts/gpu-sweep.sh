#!/usr/bin/env bash
# Tuning sweep on a GPU host, from a gpu-bundle/ folder holding the bench: one bench run
# per line of a settings file (KernelTuning's `field=value` pairs, e.g.
# `chunk_bytes=49152 stage_bytes=40960`; lab/sweeps/ has the ones behind the defaults,
# copy one into the bundle), case and modes narrowed by CASE / MODES.
#
#   gpu-bundle/sweep.sh settings.txt
cd "$(dirname "$0")"
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done; chmod +x throughput
export FUSED_CE_BENCH_SKIP_STOCK=1 FUSED_CE_BENCH_CASE=${CASE:-8192x128256}
export FUSED_CE_BENCH_MODE=${MODES:-"fwd,fwd+bwd one-pass unchecked,fwd+bwd two-pass unchecked"}
export FUSED_CE_BENCH_OUT=${FUSED_CE_BENCH_OUT:-/tmp/fused-ce-sweep}
while read -r settings; do
  [ -z "$settings" ] && continue
  echo "== $settings"
  FUSED_CE_TUNING="$settings" timeout 60 ./throughput --bench 2>&1 | grep -E "^[0-9]+x"
done < "${1:?usage: sweep.sh settings.txt}"
