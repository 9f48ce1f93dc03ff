#!/usr/bin/env bash
# Runs the CUDA test suite of a gpu-bundle/ folder one test per process, JOBS at a time,
# so that each test's result, time and failure message are written as soon as it ends:
# a run stopped early still reports every test that finished. Writes LOGDIR/tests.tsv
# (name, ok or FAILED, seconds, in the order they end) and LOGDIR/failed-NAME.log for
# each failure; prints the failures and the slowest tests last.
#
#   gpu-bundle/suite.sh LOGDIR [JOBS] [NAME-FILTER]      (JOBS: 8 by default)
#
# Kernels compiled by one process are kept for the others and for later runs: cubecl's
# compilation cache is turned on for the run (a cubecl.toml in the bundle folder; the
# workspace's `cuda` feature builds with Burn's `persistence`), and it lives in
# target/environment of the outermost folder with a Cargo.toml above it, else in the
# user's cache folder. TESTS=FILE runs the names listed in FILE instead.
# TEST_TIMEOUT (seconds, 300 by default) stops a test that runs longer: a hang costs
# that, not the whole run.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="$(mkdir -p "${1:?usage: suite.sh LOGDIR [JOBS] [NAME-FILTER]}" && cd "$1" && pwd)"
jobs="${2:-8}"
filter="${3:-}"
for packed in "$here"/suite.xz "$here"/suite.gz; do
  [ -e "$packed" ] || continue
  case "$packed" in
    *.xz) xz -d -f "$packed" ;;
    *) gunzip -f "$packed" ;;
  esac
done
chmod +x "$here/suite"
cd "$here"
printf '[compilation]\ncache = true\n' > cubecl.toml
trap 'rm -f cubecl.toml' EXIT
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
. "$here/cuda-libs.sh"
if [ -n "${TESTS:-}" ]; then
  names="$(cat "$TESTS")"
else
  names="$(./suite --list 2>/dev/null | sed -n 's/: test$//p' | grep -F -- "$filter")"
fi
: > "$logs/tests.tsv"
run_one() {
  local name="$1" logs="$2" start end status log
  log="$logs/test-${name//::/-}.log"
  start=$(date +%s.%N)
  if timeout -k 10 "${TEST_TIMEOUT:-300}" ./suite --exact "$name" --test-threads=1 > "$log" 2>&1; then
    status=ok
  else
    status=FAILED
  fi
  end=$(date +%s.%N)
  awk -v n="$name" -v s="$status" -v a="$start" -v b="$end" \
    'BEGIN { printf "%s\t%s\t%.1f\n", n, s, b - a }' >> "$logs/tests.tsv"
  if [ "$status" = ok ]; then rm -f "$log"; else mv "$log" "$logs/failed-${name//::/-}.log"; fi
}
export -f run_one
export TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
printf '%s\n' "$names" | xargs -P "$jobs" -I{} bash -c 'run_one "$1" "$2"' _ {} "$logs"
total=$(grep -c . "$logs/tests.tsv")
failed=$(grep -c $'\tFAILED\t' "$logs/tests.tsv")
echo "== slowest"
sort -t$'\t' -k3 -rn "$logs/tests.tsv" | head -8
echo "== failed"
grep $'\tFAILED\t' "$logs/tests.tsv" || true
echo "$((total - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
