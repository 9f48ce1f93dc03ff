#!/usr/bin/env bash
# Runs what a gpu-bundle/ folder holds (scripts/gpu-bundle.sh) on a GPU host with no Rust:
# the CUDA test suite, the PyTorch oracle, the language-model example, then the bench.
# Logs and the bench's results.{md,csv,svg} go to LOGDIR.
#
#   gpu-bundle/run.sh LOGDIR [test-filter]
#
# SKIP_SUITE=1, SKIP_ORACLE=1, SKIP_TRAIN=1 and SKIP_BENCH=1 leave those parts out;
# TRAIN_ARGS gives train_lm's flags (default: --size small --compare; with Burn 0.22.1's
# autotune GPT-2 stops at its first step, Burn issue tracel-ai/burn#4163);
# UNTUNED_TRAIN_ARGS gives train_lm_untuned's (default: --size gpt2 --compare --dtype bf16);
# MAX_BATCH_ARGS (e.g. "--size gpt2 --compare --dtype bf16") runs train_lm_untuned with
# them and --max-batch --steps 2 instead: the largest batch of each way
# (LOGDIR/max_batch.log);
# LINEAR_HEAD_RUNS gives the LM-head bench's runs, separated by `;`, each its arguments
# (shapes, logits=M, wblock=M, inplace=1; default: one run of the default cases), each run's
# results in LOGDIR/linear_head-K;
# TEST_THREADS runs that many tests at once (default 1: the LLM-sized cases each hold
# several GB of device memory).
# AUTOTUNE_LOG=1 writes every autotuned kernel's candidates and their times to
# LOGDIR/autotune.log (through a cubecl.toml in the working folder; shapes already in the
# autotune cache are not tuned again, so leave the cache behind to see them).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:?usage: run.sh LOGDIR [test-filter]}"; mkdir -p "$logs"
filter="${2:-}"
# The bundle carries compressed executables (xz; gzip in older bundles).
for packed in "$here"/*.xz "$here"/*.gz; do
  [ -e "$packed" ] || continue
  case "$packed" in
    *.xz) xz -d -f "$packed" ;;
    *) gunzip -f "$packed" ;;
  esac && chmod +x "${packed%.*}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$logs/gpu.txt" 2>&1
. "$here/cuda-libs.sh"
cat "$logs/gpu.txt"
[ -f "$here/commit.txt" ] && cp "$here/commit.txt" "$logs/commit.txt" && echo "bundle built at commit $(cat "$here/commit.txt")"
status=0
if [ -n "${AUTOTUNE_LOG:-}" ]; then
  printf '[autotune.logger]\nlevel = "full"\nfile = "%s"\n' "$(cd "$logs" && pwd)/autotune.log" > cubecl.toml
  trap 'rm -f cubecl.toml' EXIT
fi
if [ -z "${SKIP_SUITE:-}" ]; then
  for test in "$here"/*; do
    name="$(basename "$test")"
    case "$name" in logs|throughput|linear_head|vocab_parallel|torch_oracle|train_lm|train_lm_untuned|host_overhead|*.sh|*.py|*.txt|*.gz|*.xz|*.toml) continue ;; esac
    echo "== test $name"
    "$test" --test-threads="${TEST_THREADS:-1}" $filter > "$logs/test-$name.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=$rc
    grep -E "^test |test result|ok on|error" "$logs/test-$name.log" | grep -v "^test .* ok$" | tail -15
  done
fi
if [ -x "$here/torch_oracle" ] && [ -z "${SKIP_ORACLE:-}" ] && command -v python3 >/dev/null; then
  echo "== PyTorch oracle"
  if "$here/torch_oracle" /tmp/fused-ce-oracle > "$logs/oracle.log" 2>&1; then
    python3 "$here/torch_check.py" /tmp/fused-ce-oracle > "$logs/oracle-check.log" 2>&1
    rc=$?; cat "$logs/oracle-check.log"
  else
    rc=1; tail -5 "$logs/oracle.log"
  fi
  [ $rc -eq 0 ] || status=$rc
  rm -rf /tmp/fused-ce-oracle
fi
if [ -x "$here/train_lm" ] && [ -z "${SKIP_TRAIN:-}" ]; then
  echo "== language model"
  "$here/train_lm" ${TRAIN_ARGS:---size small --compare} --out "$logs/train_lm" 2>&1 \
    | tee "$logs/train_lm.log" | grep -v "^\[" | tail -40
  [ ${PIPESTATUS[0]} -eq 0 ] || status=1
fi
if [ -x "$here/train_lm_untuned" ] && [ -z "${SKIP_TRAIN:-}" ] && [ -z "${MAX_BATCH_ARGS:-}" ]; then
  echo "== language model without autotune"
  "$here/train_lm_untuned" ${UNTUNED_TRAIN_ARGS:---size gpt2 --compare --dtype bf16} \
    --out "$logs/train_lm_untuned" 2>&1 | tee "$logs/train_lm_untuned.log" | grep -v "^\[" | tail -40
  [ ${PIPESTATUS[0]} -eq 0 ] || status=1
fi
if [ -x "$here/train_lm_untuned" ] && [ -n "${MAX_BATCH_ARGS:-}" ]; then
  echo "== largest batches (language model without autotune)"
  # shellcheck disable=SC2086 # the flags, split on spaces
  "$here/train_lm_untuned" $MAX_BATCH_ARGS --max-batch --steps 2 --out "$logs/max_batch" 2>&1 \
    | tee "$logs/max_batch.log" | grep -v "step " | tail -30
  [ ${PIPESTATUS[0]} -eq 0 ] || status=1
fi
if [ -x "$here/linear_head" ] && [ -z "${SKIP_BENCH:-}" ]; then
  run=0
  head_runs=("")
  [ -z "${LINEAR_HEAD_RUNS:-}" ] || IFS=';' read -ra head_runs <<< "$LINEAR_HEAD_RUNS"
  for head_args in "${head_runs[@]}"; do
    run=$((run + 1))
    echo "== LM head bench $run: ${head_args:-default cases}"
    mkdir -p "$logs/linear_head-$run"
    # shellcheck disable=SC2086 # the run's arguments, split on spaces
    FUSED_CE_BENCH_OUT="$logs/linear_head-$run" "$here/linear_head" --bench $head_args 2>&1 \
      | tee "$logs/linear_head-$run.log" | tail -12
  done
fi
if [ -x "$here/vocab_parallel" ] && [ -z "${SKIP_BENCH:-}" ]; then
  echo "== vocabulary-parallel bench"
  FUSED_CE_BENCH_OUT="$logs" "$here/vocab_parallel" --bench 2>&1 | tee "$logs/vocab_parallel.log" | tail -8
fi
if [ -x "$here/throughput" ] && [ -z "${SKIP_BENCH:-}" ]; then
  echo "== bench"
  FUSED_CE_BENCH_OUT="$logs" FUSED_CE_BENCH_DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    "$here/throughput" --bench 2>&1 | tee "$logs/bench.log" | tail -40
fi
exit $status
