#!/usr/bin/env python3
"""Registers, shared memory and spills of every kernel cubecl compiled in a run.

On the GPU host (it has nvcc): run an executable with CUBECL_DEBUG_LOG=/tmp/cubecl.log,
then `python3 kernel_registers.py /tmp/cubecl.log`. Each kernel's CUDA source is cut
out of the log and compiled for sm_90a with `ptxas -v`; prints one line per kernel.
"""
import re, subprocess, sys, tempfile, os

log = open(sys.argv[1], errors="replace").read()
blocks = re.findall(r"\[START_KERNEL_COMPILATION\](.*?)\[END_KERNEL_COMPILATION\]", log, re.S)
seen = set()
for block in blocks:
    name = re.search(r"\nname: (.*)", block)
    name = name.group(1).strip() if name else "?"
    source = re.search(r"```cpp\n(.*)\n```", block, re.S)
    if not source or source.group(1) in seen:
        continue
    seen.add(source.group(1))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cu")
        open(path, "w").write(source.group(1))
        done = subprocess.run(
            ["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", os.path.join(tmp, "k.cubin"), path],
            capture_output=True, text=True)
        info = " ".join(l.strip() for l in done.stderr.splitlines()
                        if "registers" in l or "spill" in l or "error" in l)
        print(f"{name[:90]}: {info[:300]}")
