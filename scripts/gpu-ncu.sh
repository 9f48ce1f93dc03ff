#!/usr/bin/env bash
# Kernel-only figures on a GPU host with Nsight Compute (ncu, e.g. in /usr/local/cuda/bin):
# for each line of a settings file (KernelTuning's `field=value` pairs, as sweep.sh), the
# bench runs one case and mode while ncu reads the chosen kernel's duration, DRAM bytes
# and instructions at the clocks the bench runs at (`--clock-control none`; ncu's default
# locks them at base). Far more repeatable than the bench's wall times: time kernel
# changes here, the whole step with the bench.
#
#   gpu-bundle/ncu.sh settings.txt     KERNEL (regex, default one_pass_kernel), CASE, MODES
#   CASES="8192x128256 16384x151936" gpu-bundle/ncu.sh settings.txt   (each case in turn)
#   KERNEL=. LAUNCHES=40 gpu-bundle/ncu.sh list.txt   (every kernel of the first launches)
cd "$(dirname "$0")"
if [ -n "${CASES:-}" ]; then
  for case in $CASES; do
    echo "#### $case"
    CASES= CASE=$case "./$(basename "$0")" "$@"
  done
  exit 0
fi
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done; chmod +x throughput
export PATH="$PATH:/usr/local/cuda/bin"
export FUSED_CE_BENCH_SKIP_STOCK=1 FUSED_CE_BENCH_CASE=${CASE:-8192x128256}
export FUSED_CE_BENCH_MODE=${MODES:-"fwd+bwd one-pass unchecked"}
export FUSED_CE_BENCH_OUT=${FUSED_CE_BENCH_OUT:-/tmp/fused-ce-ncu}
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__inst_executed.sum
# Cubes per SM and what limits them (registers, shared memory) with OCCUPANCY=1.
[ "${OCCUPANCY:-0}" = 1 ] && metrics=$metrics,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__shared_mem_per_block_dynamic
while read -r settings; do
  [ -z "$settings" ] && continue
  echo "== $settings"
  FUSED_CE_TUNING="$settings" timeout 120 ncu --clock-control none --kernel-name "regex:${KERNEL:-one_pass_kernel}" \
    --launch-skip "${SKIP:-2}" --launch-count "${LAUNCHES:-1}" --metrics "$metrics" \
    ./throughput --bench 2>&1 \
    | awk '/^  [a-zA-Z_]/ {name = $1} /gpu__time|dram__bytes|inst_executed|launch__/ \
           {printf "%s %s %s %s\n", name, $1, $(NF-1), $NF}'
done < "${1:?usage: ncu.sh settings.txt}"
