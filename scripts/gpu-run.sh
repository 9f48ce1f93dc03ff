#!/usr/bin/env bash
# Runs the CUDA suite and the bench from a gpu-bundle/ folder; logs go to $OUT (or ./logs).
# Usage on the GPU host: gpu-bundle/run.sh [test-filter]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/logs}"; mkdir -p "$out"
# The bundle carries gzipped executables (scripts/gpu-bundle.sh).
for packed in "$here"/*.gz; do
  [ -e "$packed" ] || continue
  gunzip -f "$packed" && chmod +x "${packed%.gz}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
status=0
for test in "$here"/*; do
  name="$(basename "$test")"
  case "$name" in logs|throughput|torch_oracle|train_lm|host_overhead|*.sh|*.py|*.txt|*.gz) continue ;; esac
  echo "== test $name"
  # One test thread: the LLM-sized cases each hold several GB of device memory.
  "$test" --test-threads=1 ${1:-} > "$out/test-$name.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=$rc
  grep -E "^test |test result|ok on|error" "$out/test-$name.log" | grep -v "^test .* ok$" | tail -15
done
if [ -x "$here/torch_oracle" ] && command -v python3 >/dev/null; then
  echo "== PyTorch oracle"
  if "$here/torch_oracle" /tmp/fused-ce-oracle > "$out/oracle.log" 2>&1; then
    python3 "$here/torch_check.py" /tmp/fused-ce-oracle > "$out/oracle-check.log" 2>&1
    rc=$?; cat "$out/oracle-check.log"
  else
    rc=1; tail -5 "$out/oracle.log"
  fi
  [ $rc -eq 0 ] || status=$rc
  rm -rf /tmp/fused-ce-oracle
fi
if [ -x "$here/train_lm" ]; then
  echo "== language model (--big --compare-stock)"
  "$here/train_lm" --big --compare-stock 2>&1 | tee "$out/train_lm.log" | grep -vE "^\[.*step +[1-9]" | tail -40
  [ ${PIPESTATUS[0]} -eq 0 ] || status=1
fi
if [ -x "$here/throughput" ] && [ -z "${SKIP_BENCH:-}" ]; then
  echo "== bench"
  "$here/throughput" --bench 2>&1 | tee "$out/bench.log" | tail -30
fi
exit $status
