#!/usr/bin/env bash
# Builds the CUDA executables (release, CUDARC_CUDA_VERSION=13000: the driver and NVRTC
# are loaded at run time, no toolkit needed here) into gpu-bundle/, stripped, with
# gpu-bundle/run.sh that runs what is there on a GPU host and logs to $OUT.
#
#   scripts/gpu-bundle.sh [suite] [bench] [oracle] [train_lm] [host_overhead]
#                                                  (default: suite bench oracle)
#
# A device call carries at most 64 MiB: the executables travel gzipped (run.sh unpacks
# them), which fits the default three (about 25 MiB); all four may not fit.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=gpu-bundle
parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(suite bench oracle)
grep -qx "/$bundle/" .git/info/exclude 2>/dev/null || echo "/$bundle/" >> .git/info/exclude
rm -rf "$bundle" && mkdir -p "$bundle"
export CUDARC_CUDA_VERSION=13000
build=(cargo build --release --no-default-features --features cuda)
for part in "${parts[@]}"; do
  case "$part" in
    suite) build+=(--test suite) ;;
    bench) build+=(--bench throughput) ;;
    oracle) build+=(--example torch_oracle) ;;
    train_lm) build+=(--example train_lm) ;;
    host_overhead) build+=(--example host_overhead) ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
"${build[@]}"
"${build[@]}" --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
            and msg["target"]["kind"][0] in ("test", "bench", "example") \
            and msg["package_id"].split("#")[0].endswith("main"):
        print(msg["target"]["name"], msg["executable"])
' | while read -r name exe; do
    cp "$exe" "$bundle/$name" && strip "$bundle/$name" && gzip -9 "$bundle/$name"
  done
cp scripts/gpu-run.sh "$bundle/run.sh"
cp scripts/gpu-sweep.sh "$bundle/sweep.sh"
cp scripts/gpu-ab.sh "$bundle/ab.sh"
cp scripts/gpu-ncu.sh "$bundle/ncu.sh"
cp scripts/torch_check.py "$bundle/torch_check.py"
cp scripts/kernel_registers.py "$bundle/kernel_registers.py"
cp scripts/sweeps/*.txt "$bundle/"
du -sh "$bundle"; ls -la "$bundle"
