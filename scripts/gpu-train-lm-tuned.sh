#!/usr/bin/env bash
# GPT-2 small with Burn's autotune on a GPU host with no Rust, from an environment file that
# holds its kernels already (scripts/precompile.sh), resumable across runs cut short:
#
#   train-lm-tuned.sh LOGDIR        (in a gpu-bundle/ with train_lm, scripts/gpu-bundle.sh)
#
# The bundle holds environment.db.xz, or its parts (environment.db.xz.part-*, as this script
# saves it). A machine that ran this before resumes from its /tmp/env instead. First the
# driver's JIT cache gets every PTX kernel of the file, on all cores (jit_warm.py); then `train_lm --size gpt2 --compare --dtype bf16` runs from the file,
# for at most TRAIN_TIMEOUT seconds (default 480), printing every 30 s the file's size, the
# GPU's use, the busiest thread, and the kernels compiled and keys tuned so far (CubeCL's
# logs, kept in LOGDIR). LOGDIR gets the grown file back, xz'd in 15 MB parts (SAVE=0: not),
# with CubeCL's throughput probes, which scripts/precompile.sh's stand-in driver reuses.
# CUBECL_AUTOTUNE_LEVEL sets Burn's autotune level (default balanced).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="$(mkdir -p "${1:?usage: train-lm-tuned.sh LOGDIR}" && cd "$1" && pwd)"
cd "$here"
[ -x train_lm ] || { xz -dkf train_lm.xz && chmod +x train_lm; }
. ./cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
# Read by CubeCL from the working folder. Its records (a log of its own work) are off: turso
# panicked inserting one into an exported environment.
cat > cubecl.toml <<'TOML'
[autotune.logger]
file = "/tmp/autotune.log"
level = "minimal"

[compilation.logger]
file = "/tmp/compilation.log"
level = "full"

[environment.records]
level = "off"
TOML
mkdir -p /tmp/env; rm -f /tmp/autotune.log /tmp/compilation.log
# The kernels compiled and the autotune keys settled so far, from CubeCL's logs.
progress() {
  echo "kernels compiled $(grep -c START_KERNEL_COMPILATION /tmp/compilation.log 2>/dev/null);" \
    "keys tuned $(grep -c '^Fastest' /tmp/autotune.log 2>/dev/null)"
}
if [ ! -s /tmp/env/environment.db ]; then
  if ls environment.db.xz.part-* >/dev/null 2>&1; then
    cat environment.db.xz.part-* | xz -dc > /tmp/env/environment.db
  elif [ -f environment.db.xz ]; then
    xz -dc environment.db.xz > /tmp/env/environment.db
  fi
fi
echo "environment: $(stat -c %s /tmp/env/environment.db 2>/dev/null || echo 0) bytes"
# The driver JIT-compiles each PTX kernel as CubeCL loads it, one at a time; from its cache
# instead, once this has filled it.
export CUDA_CACHE_PATH=/tmp/nvcache CUDA_CACHE_MAXSIZE=4294967296
mkdir -p /tmp/nvcache
if [ ! -f /tmp/nvcache/warmed ] && [ -s /tmp/env/environment.db ]; then
  python3 jit_warm.py /tmp/env/environment.db && touch /tmp/nvcache/warmed
fi
./train_lm --environment /tmp/env/environment.db --size gpt2 --compare --dtype bf16 \
  --out /tmp/train_lm-out > "$logs/train_lm.log" 2>&1 &
pid=$!
start=$(date +%s)
limit=${TRAIN_TIMEOUT:-480}
tick=0
while kill -0 $pid 2>/dev/null && [ $(($(date +%s) - start)) -lt "$limit" ]; do
  sleep 5; tick=$((tick + 1)); [ $((tick % 6)) -eq 0 ] || continue
  busiest=$(for task in /proc/$pid/task/*; do
      echo "$(awk '{print $14+$15}' "$task/stat" 2>/dev/null) $(cat "$task/comm" 2>/dev/null)"
    done | sort -n -r | head -1)
  echo "[$(($(date +%s) - start))s] environment $(du -cb /tmp/env/* 2>/dev/null | tail -1 | cut -f1) bytes;" \
    "GPU $(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader);" \
    "busiest thread (cpu ticks, name) $busiest; $(progress)"
done
if kill -0 $pid 2>/dev/null; then
  echo "train_lm still running at $(($(date +%s) - start)) s: stopped"
  kill $pid; sleep 3; kill -9 $pid 2>/dev/null
else
  wait $pid; echo "train_lm rc $? at $(($(date +%s) - start)) s"
fi
tail -30 "$logs/train_lm.log" | cut -c1-300
progress
[ -f /tmp/autotune.log ] && gzip -c /tmp/autotune.log > "$logs/autotune.log.gz"
[ -f /tmp/compilation.log ] && gzip -c /tmp/compilation.log > "$logs/compilation.log.gz"
if [ "${SAVE:-1}" = 1 ]; then
  rm -f /tmp/saved.db
  ./train_lm --environment /tmp/env/environment.db --save-environment /tmp/saved.db \
    && python3 keep_probes.py /tmp/env/environment.db /tmp/saved.db \
    && xz -T0 -6 -c /tmp/saved.db | split -b 15000000 - "$logs/environment.db.xz.part-"
fi
ls -la "$logs"
