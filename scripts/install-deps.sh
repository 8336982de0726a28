#!/usr/bin/env bash
# Install what building and testing banlieue needs on a fresh Debian 12 machine.
# Idempotent: skips what is already there. Needs root (or sudo) for apt-get.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_apt=()
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v cc >/dev/null || need_apt+=(build-essential)
if [ ${#need_apt[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi

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
