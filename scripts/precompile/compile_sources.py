#!/usr/bin/env python3
"""Compiles every k*.cu the stand-in NVRTC (nvrtc.c) wrote, with the options it recorded,
on every core, with NVIDIA's NVRTC (NVRTC_LIB): k*.ptx, or k*.err with NVRTC's log.

    compile_sources.py DIR [processes]"""
import ctypes, glob, multiprocessing as mp, os, sys, time

def compile_one(path):
    base = path[:-3]
    if os.path.exists(base + ".ptx") or os.path.exists(base + ".err"):
        return 0.0
    nvrtc = ctypes.CDLL(os.environ["NVRTC_LIB"])
    src = open(path, "rb").read()
    opts = [l.encode() for l in open(base + ".opts").read().splitlines() if l]
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, None, 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*opts)
    t = time.time()
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    dt = time.time() - t
    size = ctypes.c_size_t()
    if rc == 0:
        nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetPTX(prog, buf)
        open(base + ".ptx.tmp", "wb").write(buf.value)
        os.rename(base + ".ptx.tmp", base + ".ptx")
    else:
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        open(base + ".err", "wb").write(buf.value)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return dt

if __name__ == "__main__":
    files = sorted(glob.glob(os.path.join(sys.argv[1], "k*.cu")), key=os.path.getsize, reverse=True)
    procs = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    start = time.time()
    with mp.Pool(procs) as pool:
        times = pool.map(compile_one, files, chunksize=1)
    errs = len(glob.glob(os.path.join(sys.argv[1], "k*.err")))
    print(f"{len(files)} sources, {errs} refused, {sum(times):.0f} s of NVRTC in {time.time() - start:.0f} s")
