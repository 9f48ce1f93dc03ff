#!/usr/bin/env python3
"""Registers of CUDA C++ kernels without a GPU: each file is compiled as cubecl's CUDA
runtime compiles it (NVRTC, sm_90a, -lineinfo), then `ptxas -v` counts its registers.

    NVIDIA_ROOT=<folder with bin/ptxas, lib/libnvrtc.so.13, include> nvrtc_registers.py K.cu...

`lab/kernel_registers_offline.sh` fetches NVRTC and ptxas (NVIDIA's pip wheels) and
runs this on the kernels `crates/fused-ce-kernels/examples/cuda_source.rs` writes.
"""
import ctypes, os, subprocess, sys

root = os.environ["NVIDIA_ROOT"]
nvrtc = ctypes.CDLL(root + "/lib/libnvrtc.so.13")


def compile_ptx(source, opts=None, name=b"k.cu"):
    """NVRTC with `opts`, by default the options cubecl-cuda passes: (PTX bytes, None) or
    (None, the log). cubecl-cuda names no program (`name=None`)."""
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, name, 0, None, None) == 0
    if opts is None:
        opts = [b"--gpu-architecture=sm_90a", ("--include-path=" + root + "/include").encode(),
                ("--include-path=" + root + "/include/cccl").encode(), b"-lineinfo"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
        return None, log.value.decode()
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value, None


def registers(path):
    ptx, log = compile_ptx(open(path).read().encode())
    if ptx is None:
        return "compilation failed: " + log[-2000:]
    base = os.path.splitext(path)[0]
    open(base + ".ptx", "wb").write(ptx)
    out = subprocess.run([root + "/bin/ptxas", "-arch=sm_90a", "-v", base + ".ptx", "-o", base + ".cubin"],
                         capture_output=True, text=True)
    return " ".join(l.split(":", 1)[-1].strip() for l in out.stderr.splitlines()
                    if "registers" in l or "spill" in l or "rror" in l)


def occupancy(path, info):
    """Cubes an H200 SM can hold: by registers (64K, allocated per warp in units of 256),
    shared memory (228 KB, 1 KB reserved per cube), threads (2048) and the 32-cube cap."""
    import re
    source = open(path).read()
    units = re.search(r"__launch_bounds__\((\d+)\)", source)
    used = re.search(r"Used (\d+) registers", info)
    if not units or not used:
        return ""
    units, regs = int(units.group(1)), int(used.group(1))
    shared = sum(int(b) for b in re.findall(r"Shared array size: \d+, (\d+) bytes", source))
    warps = (units + 31) // 32
    per_warp = ((regs * 32 + 255) // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    by_shared = (228 * 1024) // (shared + 1024)
    cubes = min(by_regs, by_shared, 2048 // units, 32)
    return (f" | {units} units, {shared // 1024} KB shared: {cubes} cubes per SM "
            f"(registers {by_regs}, shared memory {by_shared}, threads {2048 // units})")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        info = registers(path)
        print(f"{os.path.basename(path)}: {info}{occupancy(path, info)}")
