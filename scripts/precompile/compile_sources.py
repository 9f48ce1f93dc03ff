#!/usr/bin/env python3
"""Compiles every k*.cu the stand-in NVRTC (nvrtc.c) wrote, with the options it recorded,
on every core, with NVIDIA's NVRTC (scripts/nvrtc_registers.py's, from NVIDIA_ROOT):
k*.ptx, or k*.err with NVRTC's log.

    NVIDIA_ROOT=<folder with lib/libnvrtc.so.13> compile_sources.py DIR [processes]"""
import glob, multiprocessing as mp, os, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nvrtc_registers import compile_ptx  # noqa: E402


def compile_one(path):
    base = path[:-3]
    if os.path.exists(base + ".ptx") or os.path.exists(base + ".err"):
        return 0.0
    opts = [line.encode() for line in open(base + ".opts").read().splitlines() if line]
    start = time.time()
    ptx, log = compile_ptx(open(path, "rb").read(), opts, name=None)
    took = time.time() - start
    if ptx is None:
        open(base + ".err", "w").write(log)
    else:
        open(base + ".ptx.tmp", "wb").write(ptx)
        os.rename(base + ".ptx.tmp", base + ".ptx")
    return took


if __name__ == "__main__":
    files = sorted(glob.glob(os.path.join(sys.argv[1], "k*.cu")), key=os.path.getsize, reverse=True)
    procs = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    start = time.time()
    with mp.Pool(procs) as pool:
        times = pool.map(compile_one, files, chunksize=1)
    errs = len(glob.glob(os.path.join(sys.argv[1], "k*.err")))
    print(f"{len(files)} sources, {errs} refused, {sum(times):.0f} s of NVRTC in {time.time() - start:.0f} s")
