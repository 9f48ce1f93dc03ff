#!/usr/bin/env python3
"""How long NVRTC takes on each kernel of CubeCL compilation logs, on a machine with no GPU.

CubeCL's compilation logger at level "full" (`[compilation.logger] level = "full"` in a
`cubecl.toml`) writes each kernel's CUDA C++ before NVRTC compiles it. This compiles each
one again with cubecl-cuda's options (`nvrtc_registers.compile_ptx`), one process per core,
and prints the slowest kernels and the seconds by tile matmul (Register, Mma, Cmma, none).

    root=~/.cache/fused-ce-nvidia/nvidia/cu13
    NVIDIA_ROOT=$root LD_LIBRARY_PATH=$root/lib python3 scripts/nvrtc_times.py LOG[.gz]...

`scripts/kernel_registers_offline.sh` fetches NVRTC into ~/.cache/fused-ce-nvidia. Kernels
that include <mma.h> fail to compile here: NVIDIA's pip wheels lack its `crt/mma.h`.
"""
import collections, gzip, multiprocessing, os, re, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvrtc_registers import compile_ptx  # noqa: E402


def kernels(path):
    """(log:index, kernel name, tile matmul, CUDA source) for each kernel the log began."""
    text = (gzip.open if path.endswith(".gz") else open)(path, "rt").read()
    for index, entry in enumerate(text.split("[START_KERNEL_COMPILATION]")[1:], 1):
        name = re.search(r"name: (\S+)", entry)
        tile = re.search(r"tile_matmul: (\w+)", entry)
        source = re.search(r"```cpp\n(.*?)\n```", entry, re.S)
        if source:
            yield (f"{path}:{index}", name.group(1).rstrip("<") if name else "?",
                   tile.group(1) if tile else "none", source.group(1))


def timed(kernel):
    label, name, tile, source = kernel
    start = time.time()
    ptx, _log = compile_ptx(source.encode())
    return label, name, tile, time.time() - start, len(ptx) if ptx is not None else None


if __name__ == "__main__":
    todo = [k for path in sys.argv[1:] for k in kernels(path)]
    with multiprocessing.Pool(os.cpu_count()) as pool:
        results = pool.map(timed, todo, chunksize=1)
    print("slowest (seconds, PTX bytes, tile matmul, kernel):")
    for label, name, tile, seconds, ptx in sorted(results, key=lambda r: -r[3])[:15]:
        print(f"  {seconds:7.1f} {ptx if ptx is not None else 'failed':>9} {tile:9} {label} {name}")
    by_tile = collections.defaultdict(lambda: [0, 0.0, 0])
    for _label, _name, tile, seconds, ptx in results:
        by_tile[tile][0] += 1
        by_tile[tile][1] += seconds if ptx is not None else 0.0
        by_tile[tile][2] += ptx is None
    print("by tile matmul (kernels, seconds of those that compiled, failed):")
    for tile, (count, seconds, failed) in sorted(by_tile.items(), key=lambda t: -t[1][1]):
        print(f"  {tile:9} {count:4} {seconds:8.1f} s {failed:4} failed")
    print(f"all: {len(results)} kernels, {sum(r[3] for r in results if r[4] is not None):.1f} s")
