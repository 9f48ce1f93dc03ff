#!/usr/bin/env python3
"""Fills the CUDA driver's JIT cache with every PTX kernel of a CubeCL environment file, on
all cores, so the run that loads them finds their SASS there instead of JIT-compiling them
one at a time on CubeCL's device thread.

    CUDA_CACHE_PATH=DIR CUDA_CACHE_MAXSIZE=4294967296 jit_warm.py environment.db [processes]

The driver keys its cache on the PTX, so the run finds these as long as it uses the same
CUDA_CACHE_PATH and the same driver."""
import ctypes, multiprocessing as mp, os, sqlite3, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from environment import decode


def ptx_of(value):
    return decode(value) + b"\x00"


def warm(rows):
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    failed = 0
    for value in rows:
        module = ctypes.c_void_p()
        if cuda.cuModuleLoadData(ctypes.byref(module), ptx_of(value)) == 0:
            cuda.cuModuleUnload(module)
        else:
            failed += 1
    return len(rows), failed


if __name__ == "__main__":
    start = time.time()
    db = sqlite3.connect(sys.argv[1])
    rows = [bytes(v) for (v,) in db.execute(
        "select value from entries where namespace like 'cuda/%' order by length(value) desc")]
    procs = int(sys.argv[2]) if len(sys.argv) > 2 else mp.cpu_count()
    # Largest first, dealt round-robin, so no process is left with the slow tail alone.
    shares = [rows[k::procs] for k in range(procs)]
    with mp.get_context("spawn").Pool(procs) as pool:
        done = pool.map(warm, shares)
    print(f"JIT cache warmed: {sum(d for d, _ in done)} PTX kernels "
          f"({sum(len(r) for r in rows) / 1e6:.0f} MB of entries), "
          f"{sum(f for _, f in done)} refused, {time.time() - start:.0f} s on {procs} processes")
