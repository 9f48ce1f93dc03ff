#!/usr/bin/env bash
# Runs a command after making sure a Vulkan driver exists. On a machine with no GPU
# driver, installs Mesa's lavapipe (software Vulkan on the CPU, Debian package
# mesa-vulkan-drivers) first. Usage: scripts/with-vulkan.sh cargo test
set -euo pipefail
has_vulkan_driver() {
  # Either folder may be missing: one manifest in either is enough.
  local dir
  for dir in /usr/share/vulkan/icd.d /etc/vulkan/icd.d; do
    ls "$dir"/*.json >/dev/null 2>&1 && return 0
  done
  return 1
}
if ! has_vulkan_driver; then
  echo "no Vulkan driver found: installing lavapipe (mesa-vulkan-drivers)" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers >/dev/null
fi
# wgpu warns without it; harmless, but keep logs clean.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
exec "$@"
