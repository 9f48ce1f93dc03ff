#!/usr/bin/env bash
# Supplies the LLVM that Burn 0.22's CUDA build links (cubecl-llvm, through
# tracel-llvm-bundler 23.1.0-4) on machines that cannot reach the bundler's download.
# Users' own builds need none of this: there the bundler downloads LLVM as Burn documents.
#
# PyPI's `mlc-llvm-static` ships LLVM 23.1.1 as static libraries, with the NVPTX target
# and an `llvm-config` that answers `--link-static`. The bundler skips its download when
# `<data_local_dir>/tracel/tracel-llvm-23.1.0-4/.tracel-llvm-installed` exists
# (`data_local_dir` is `$XDG_DATA_HOME`, else `~/.local/share`), so that path becomes a
# link to the package's prefix, with the file in it. Idempotent; prints the prefix.
set -euo pipefail
llvm_package='mlc-llvm-static[all]==23.1.1.post0'
bundle_name=tracel-llvm-23.1.0-4
data_dir="${XDG_DATA_HOME:-$HOME/.local/share}"
target="$data_dir/tracel/$bundle_name"
venv="$data_dir/burn-fused-ce-llvm"

if [ -e "$target/.tracel-llvm-installed" ] && [ -x "$target/bin/llvm-config" ]; then
  echo "$target"; exit 0
fi
# The static libraries link against zlib and zstd; the shims build with a C++ compiler.
missing=()
for pkg in python3-venv libzstd-dev zlib1g-dev g++; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "$llvm_package"
prefix="$("$venv/bin/python" -m mlc_llvm_static.config --prefix)"
"$prefix/bin/llvm-config" --targets-built | grep -qw NVPTX \
  || { echo "the LLVM of $llvm_package has no NVPTX target" >&2; exit 1; }
mkdir -p "$(dirname "$target")"
rm -rf "$target"
ln -s "$prefix" "$target"
touch "$target/.tracel-llvm-installed"
echo "$target"
