# Sourced by the bundle's scripts: puts NVIDIA's cuBLASLt on the dynamic loader's path
# where it is not there already. The fused linear cross-entropy loads it at run time for
# its products (`LinearChunking::cublaslt`); a GPU host with PyTorch has it in its CUDA
# wheels (nvidia/cu13/lib for CUDA 13, nvidia/cublas/lib for CUDA 12), a CUDA toolkit in
# its lib64. Prints where it was found, or that it was not.
cuda_libs_found=""
if ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so\.1[23]'; then
  cuda_libs_found="the ld.so cache"
else
  cuda_libs_candidates="$(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)"
  for cuda_libs_dir in $(printf '%s\n' $cuda_libs_candidates | sed 's#$#/nvidia/cu13/lib#') \
      $(printf '%s\n' $cuda_libs_candidates | sed 's#$#/nvidia/cublas/lib#') \
      /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    if ls "$cuda_libs_dir"/libcublasLt.so.1[23]* >/dev/null 2>&1; then
      export LD_LIBRARY_PATH="$cuda_libs_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      cuda_libs_found="$cuda_libs_dir"
      break
    fi
  done
fi
echo "cuBLASLt: ${cuda_libs_found:-not found, the products run on the CubeCL kernels}"
