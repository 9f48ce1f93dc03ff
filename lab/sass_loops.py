#!/usr/bin/env python3
"""The loops of a kernel's SASS (`cuobjdump -sass` output): for each backward branch, the
loop's length in instructions and its loads, stores and exponentials (`MUFU`), with the
most frequent opcodes. Instructions per element = a loop's length / elements per trip.

    cuobjdump -sass k.cubin > k.sass; sass_loops.py k.sass
(`SASS=1 lab/kernel_registers_offline.sh` does both for the one-pass kernel.)
"""
import collections, re, sys

ins = []
for line in open(sys.argv[1]):
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2)))
index = {pc: i for i, (pc, _) in enumerate(ins)}


def opcode(op):
    return (op.split()[1] if op.startswith("@") else op.split()[0]) if op.split() else "?"


for i, (pc, op) in enumerate(ins):
    m = re.search(r"BRA (0x[0-9a-f]+)", op)
    if not m or int(m.group(1), 16) >= pc:
        continue
    body = [opcode(o) for _, o in ins[index[int(m.group(1), 16)]:i + 1]]
    kinds = collections.Counter(o.split(".")[0] for o in body)
    memory = ", ".join(f"{k} {kinds[k]}" for k in ("LDG", "STG", "LDS", "STS", "MUFU") if kinds[k])
    top = ", ".join(f"{o} {c}" for o, c in collections.Counter(body).most_common(6))
    print(f"loop {int(m.group(1), 16):#06x}-{pc:#06x}: {len(body)} instructions ({memory}); {top}")
