# Sourced: NVIDIA's CUDA 13.0 compiler pieces from their pip wheels, fetched once into
# ~/.cache/fused-ce-nvidia, for work on CUDA kernels on a machine with no GPU or toolkit:
# NVRTC, ptxas, the runtime's headers (cuda.h among them), CCCL, and the crt headers (the
# wmma kernels CubeCL emits include crt/mma.h). Sets `nvidia_root` to their folder.
nvidia_cache="${HOME}/.cache/fused-ce-nvidia"
nvidia_root="$nvidia_cache/nvidia/cu13"
if [ ! -x "$nvidia_root/bin/ptxas" ] || [ ! -e "$nvidia_root/lib/libnvrtc.so.13" ] \
    || [ ! -e "$nvidia_root/include/crt/mma.h" ]; then
  mkdir -p "$nvidia_cache/wheels"
  python3 -m pip download --no-deps -q -d "$nvidia_cache/wheels" \
    "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*"
  for wheel in "$nvidia_cache"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$nvidia_cache"; done
  chmod +x "$nvidia_root"/bin/*
fi
