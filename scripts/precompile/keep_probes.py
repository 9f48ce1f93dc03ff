#!/usr/bin/env python3
"""Copies CubeCL's throughput-probe results (the GPU's peak rates, which set its autotune
bounds) from a live environment file into one `--save-environment` exported, which leaves
them out: the stand-in driver of scripts/precompile.sh then reuses the GPU's instead of
probing its own.   keep_probes.py LIVE_FILE EXPORTED_FILE"""
import os, shutil, sqlite3, sys, tempfile

live, exported = sys.argv[1:3]
# A copy, WAL included: the live file may still be open, and reading it must not change it.
copy = tempfile.mkdtemp()
for suffix in ("", "-wal"):
    if os.path.exists(live + suffix):
        shutil.copy(live + suffix, os.path.join(copy, "live.db" + suffix))
source = sqlite3.connect(os.path.join(copy, "live.db"))
rows = source.execute(
    "select namespace, key, value, origin from entries where namespace like 'throughput/%'").fetchall()
source.close()
out = sqlite3.connect(exported)
out.executemany("insert or replace into entries values (?, ?, ?, ?)", rows)
out.commit()
shutil.rmtree(copy)
print(f"throughput probes kept: {len(rows)}")
