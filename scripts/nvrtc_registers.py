#!/usr/bin/env python3
"""Registers of CUDA C++ kernels without a GPU: each file is compiled as cubecl's CUDA
runtime compiles it (NVRTC, sm_90a, -lineinfo), then `ptxas -v` counts its registers.

    NVIDIA_ROOT=<folder with bin/ptxas, lib/libnvrtc.so.13, include> nvrtc_registers.py K.cu...

`scripts/kernel_registers_offline.sh` fetches NVRTC and ptxas (NVIDIA's pip wheels) and
runs this on the kernels `examples/cuda_source.rs` writes.
"""
import ctypes, os, subprocess, sys

root = os.environ["NVIDIA_ROOT"]
nvrtc = ctypes.CDLL(root + "/lib/libnvrtc.so.13")


def registers(path):
    src = open(path).read().encode()
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90a", ("--include-path=" + root + "/include").encode(),
            ("--include-path=" + root + "/include/cccl").encode(), b"-lineinfo"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        return "compilation failed: " + log.value.decode()[-2000:]
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    base = os.path.splitext(path)[0]
    open(base + ".ptx", "wb").write(ptx.value)
    out = subprocess.run([root + "/bin/ptxas", "-arch=sm_90a", "-v", base + ".ptx", "-o", base + ".cubin"],
                         capture_output=True, text=True)
    return " ".join(l.split(":", 1)[-1].strip() for l in out.stderr.splitlines()
                    if "registers" in l or "spill" in l or "rror" in l)


for path in sys.argv[1:]:
    print(f"{os.path.basename(path)}: {registers(path)}")
