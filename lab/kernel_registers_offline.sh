#!/usr/bin/env bash
# Registers of the one-pass kernel as it would be compiled on an H200, on a machine with
# no GPU: `crates/fused-ce-kernels/examples/cuda_source.rs` (feature `cuda-source`) writes
# the kernels' CUDA C++ (IR built through lavapipe), then NVRTC and ptxas from NVIDIA's pip
# wheels (CUDA 13.0, fetched once by lab/nvidia-wheels.sh) compile them for sm_90a.
# Registers decide how many cubes an SM holds (docs/history.md).
#
#   lab/kernel_registers_offline.sh [out-dir]          (FUSED_CE_TUNING="reread_loads=2"
#   changes the tuning, as in a bench run)
#   SASS=1 lab/kernel_registers_offline.sh            (also each kernel's loops, from its
#   SASS: cuobjdump and nvdisasm 13.2 wheels, fetched once; lab/sass_loops.py)
set -euo pipefail
cd "$(dirname "$0")/.."
sources="${1:-target/cuda-source}"
. lab/nvidia-wheels.sh
root="$nvidia_root"
cache="$nvidia_cache"
scripts/with-vulkan.sh cargo run -q -p fused-ce-kernels --features cuda-source \
  --example cuda_source -- "$sources" > /dev/null
LD_LIBRARY_PATH="$root/lib" NVIDIA_ROOT="$root" python3 lab/nvrtc_registers.py "$sources"/*.cu
if [ -n "${SASS:-}" ]; then
  if [ ! -x "$root/bin/cuobjdump" ] || [ ! -x "$root/bin/nvdisasm" ]; then
    python3 -m pip download --no-deps -q -d "$cache/wheels" \
      "nvidia-cuda-cuobjdump==13.2.*" "nvidia-cuda-nvdisasm==13.2.*"
    for wheel in "$cache"/wheels/nvidia_cuda_cuobjdump-*.whl "$cache"/wheels/nvidia_cuda_nvdisasm-*.whl; do
      python3 -m zipfile -e "$wheel" "$cache"
    done
    chmod +x "$root"/bin/*
  fi
  for cubin in "$sources"/*.cubin; do
    echo "== $(basename "$cubin" .cubin)"
    PATH="$root/bin:$PATH" cuobjdump -sass "$cubin" > "${cubin%.cubin}.sass"
    python3 lab/sass_loops.py "${cubin%.cubin}.sass"
  done
fi
