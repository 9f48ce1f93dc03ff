#!/usr/bin/env bash
# Builds the CUDA executables (release, CUDARC_CUDA_VERSION=13000: the driver and NVRTC
# are loaded at run time, no CUDA toolkit needed to build) into gpu-bundle/, stripped and
# xz-compressed, with the scripts that run them on a GPU host that has no Rust: copy the folder
# there and run `gpu-bundle/run.sh LOGDIR` (see scripts/gpu-run.sh).
#
#   scripts/gpu-bundle.sh [suite] [bench] [linear_head] [vocab_parallel] [oracle] [train_lm]
#                         [train_lm_untuned] [host_overhead]
#                                                  (default: suite bench oracle)
#
# The benches and examples are built with Burn's autotune, as users run Burn; the test
# suite without it: each of its many small shapes would tune its matmuls on first use
# (single tests of the fused linear cross-entropy ran past six minutes), and its checks
# hold whichever matmul kernel runs. `train_lm` trains the tiny and small models;
# `train_lm_untuned` is the language model without autotune, for GPT-2 (its first step
# stops in Burn 0.22.1's attention-matmul autotune, Burn issue tracel-ai/burn#4163) and
# for `--max-batch` (each try trains new shapes, and the memory a batch needs does not
# depend on the matmul kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=gpu-bundle
parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(suite bench oracle)
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx "/$bundle/" "$exclude" 2>/dev/null || echo "/$bundle/" >> "$exclude"
rm -rf "$bundle" && mkdir -p "$bundle"
export CUDARC_CUDA_VERSION=13000
# Burn 0.22's CUDA build links LLVM (cubecl-llvm); where its bundler cannot download it,
# the script supplies it from PyPI (a no-op once done).
scripts/offline-llvm.sh >/dev/null
# The bench's report names the commit it measured.
FUSED_CE_COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo '+changes')"
export FUSED_CE_COMMIT
# And so does the bundle (run.sh copies it to the logs).
echo "$FUSED_CE_COMMIT" > "$bundle/commit.txt"
# Builds the named targets of the suite's package (crates/fused-ce-suite, the workspace's
# default member) with the given features and copies their executables into the bundle,
# stripped and compressed (xz with its x86 filter and a dictionary larger than the
# executable: a tenth smaller than plain xz, which is a third smaller than gzip).
bundle_targets() {
  local features="$1" suffix="$2"; shift 2
  [ $# -gt 0 ] || return 0
  local build=(cargo build --release --no-default-features --features "$features" "$@")
  "${build[@]}"
  "${build[@]}" --message-format=json 2>/dev/null \
    | python3 -c '
import json, os, sys
suite = os.path.abspath("crates/fused-ce-suite/Cargo.toml")
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
            and msg["target"]["kind"][0] in ("test", "bench", "example") \
            and os.path.abspath(msg.get("manifest_path", "")) == suite:
        print(msg["target"]["name"], msg["executable"])
' | while read -r name exe; do
      cp "$exe" "$bundle/$name$suffix" && strip "$bundle/$name$suffix" \
        && xz --x86 --lzma2=preset=9e,dict=192MiB -T1 -f "$bundle/$name$suffix"
    done
}
tuned=()
untuned=()
untuned_renamed=()
for part in "${parts[@]}"; do
  case "$part" in
    suite) untuned+=(--test suite) ;;
    bench) tuned+=(--bench throughput) ;;
    linear_head) tuned+=(--bench linear_head) ;;
    vocab_parallel) tuned+=(--bench vocab_parallel) ;;
    oracle) tuned+=(--example torch_oracle) ;;
    train_lm) tuned+=(--example train_lm) ;;
    train_lm_untuned) untuned_renamed+=(--example train_lm) ;;
    host_overhead) tuned+=(--example host_overhead) ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
bundle_targets cuda,autotune "" "${tuned[@]}"
bundle_targets cuda "" "${untuned[@]}"
bundle_targets cuda _untuned "${untuned_renamed[@]}"
cp scripts/gpu-run.sh "$bundle/run.sh"
cp scripts/gpu-cuda-libs.sh "$bundle/cuda-libs.sh"
cp scripts/gpu-sweep.sh "$bundle/sweep.sh"
cp scripts/gpu-suite.sh "$bundle/suite.sh"
cp scripts/gpu-ab.sh "$bundle/ab.sh"
cp scripts/gpu-ncu.sh "$bundle/ncu.sh"
cp scripts/torch_check.py "$bundle/torch_check.py"
cp scripts/sweeps/*.txt "$bundle/"
du -sh "$bundle"; ls -la "$bundle"
