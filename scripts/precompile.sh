#!/usr/bin/env bash
# Compiles, on a machine with no GPU, every CUDA kernel a CubeCL program compiles on an H100
# (sm_90a), into an environment file (CubeCL's autotune results and compiled kernels) for the
# program to start from on the GPU. A cold autotuned run of a model spends most of its first
# step in NVRTC, one kernel at a time; this moves that work here, on every core.
#
#   scripts/precompile.sh ENV_FILE [GPU_FILE] -- PROGRAM ARGS...
#
# PROGRAM runs on stand-in CUDA libraries (scripts/precompile/: a driver impersonating an
# H100, cuBLASLt, and an NVRTC that records each kernel's source and answers at once), in a
# scratch folder whose cubecl.toml turns CubeCL's records off. An ARG "@ENV" is replaced by
# the environment file the run uses, so PROGRAM must take one, as train_lm's
# `--environment @ENV` does. Then NVRTC 13.0 compiles the recorded sources on every core,
# and ENV_FILE gets the run's kernels with their PTX. GPU_FILE, an environment from a GPU run,
# is where the run starts (its kernels are not compiled again, and its throughput probes,
# which train-lm-tuned.sh keeps, set the autotune bounds as on the GPU) and gives ENV_FILE
# its autotune results: the stand-in's timings mean nothing, so ENV_FILE has no others. Runs
# from ENV_FILE then add what they compile until nothing is left (see below). CubeCL's
# settings come from the caller's environment (CUBECL_AUTOTUNE_LEVEL must be the GPU run's).
# The stand-in driver refuses what the real one refuses at launch, so a program that fails
# on the GPU fails here too; the script then prints the run's last lines and stops.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
env_file="$(realpath -m "${1:?usage: precompile.sh ENV_FILE [GPU_FILE] -- PROGRAM ARGS...}")"; shift
gpu_file=""
if [ "${1:-}" != "--" ]; then gpu_file="$(realpath "$1")"; shift; fi
[ "${1:-}" = "--" ] || { echo "precompile.sh: expected -- before the program" >&2; exit 2; }
shift
program="$(realpath "$1")"; shift
cd "$repo"
. scripts/nvidia-wheels.sh
work="$(mktemp -d "${TMPDIR:-/tmp}/precompile.XXXXXX")"
here="$repo/scripts/precompile"
mkdir -p "$work/lib/nvrtc"
# Not libcuda.so.1: NVRTC loads the driver by that name, and must not find the stand-in.
gcc -O1 -shared -fPIC -I"$nvidia_root/include" -o "$work/lib/libcuda.so" "$here/driver.c" -lpthread -lm
gcc -O1 -shared -fPIC -o "$work/lib/libcublasLt.so.13" "$here/cublaslt.c"
gcc -O1 -shared -fPIC -o "$work/lib/nvrtc/libnvrtc.so.13" "$here/nvrtc.c" -lpthread
ln -s libcublasLt.so.13 "$work/lib/libcublasLt.so"
ln -s libnvrtc.so.13 "$work/lib/nvrtc/libnvrtc.so"
# CubeCL's records are a log of its own work; inserting them into an environment exported by
# CubeCL panicked in its database (turso 0.x) on this run.
printf '[environment.records]\nlevel = "off"\n' > "$work/cubecl.toml"

# Runs the program on the stand-ins from environment file $1, its sources recorded in $2.
run() {
  mkdir -p "$2"
  local args=() arg
  for arg in "${program_args[@]}"; do args+=("${arg//@ENV/$1}"); done
  (cd "$work" && LD_LIBRARY_PATH="$work/lib:$work/lib/nvrtc" CUDA_PATH="$nvidia_root" \
    PRECOMPILE_SOURCES="$2" "$program" "${args[@]}" > "$2.log" 2>&1) \
    || { tail -20 "$2.log" >&2; return 1; }
  echo "$(find "$2" -name '*.cu' | wc -l) kernels to compile (log: $2.log)"
}
# Runs the program from environment file $1, recording in $2, and adds what it compiled to
# ENV_FILE; returns 1 when it compiled nothing. Called as a condition, where `set -e` does
# not hold: a step that fails ends the script itself.
add_run() {
  run "$1" "$2" || exit 1
  [ -n "$(find "$2" -name '*.cu')" ] || return 1
  NVIDIA_ROOT="$nvidia_root" LD_LIBRARY_PATH="$nvidia_root/lib" \
    python3 "$here/compile_sources.py" "$2" || exit 1
  python3 "$here/environment.py" "$1" "$2" "$env_file" $gpu_file || exit 1
}
program_args=("$@")
if [ -n "$gpu_file" ]; then cp "$gpu_file" "$work/run.db"; fi
add_run "$work/run.db" "$work/sources" \
  || python3 "$here/environment.py" "$work/run.db" "$work/sources" "$env_file" $gpu_file
# What a run compiles varies with the autotune winners: what a GPU picks decides some of the
# kernels that come after. Runs from ENV_FILE add what they compile. The stand-in picks in
# turn each autotune's last candidate, its first (STAND_IN_LATER=slower) and one at random
# (STAND_IN_LATER=random, a new seed each time), until RANDOM_RUNS random runs are done and
# the last two runs compiled nothing.
random_runs="${RANDOM_RUNS:-4}"
quiet=0
check=0
while [ $check -lt $((3 * random_runs + 6)) ]; do
  check=$((check + 1))
  case $((check % 3)) in
    1) export STAND_IN_LATER=faster ;;
    2) export STAND_IN_LATER=slower ;;
    0) export STAND_IN_LATER=random STAND_IN_SEED=$check ;;
  esac
  cp "$env_file" "$work/check.db"
  rm -rf "$work/check"
  echo "run $check: STAND_IN_LATER=$STAND_IN_LATER"
  if add_run "$work/check.db" "$work/check"; then quiet=0; else quiet=$((quiet + 1)); fi
  [ $quiet -lt 2 ] || [ $check -lt $((3 * random_runs)) ] || break
done
[ $quiet -ge 2 ] || echo "precompile.sh: the last runs still compiled kernels; the GPU run compiles any more" >&2
rm -rf "$work"
echo "$env_file: $(du -h "$env_file" | cut -f1)"
