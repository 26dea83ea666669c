#!/usr/bin/env bash
# test-aarch64.sh — the CPU backend's packed-weight tests (`backend::cpu::quant`, the NEON `SDOT` kernel among them)
# cross-compiled for aarch64 and run under user-mode emulation (`qemu-aarch64 -cpu max`, which has the dot-product
# extension). Installs what it needs: Debian's aarch64 cross gcc and qemu-user, and rustup's aarch64 standard
# library. Not part of scripts/test.sh (the suite runs on the x86-64 host); run it after changing `quant/`.
# Usage: bash scripts/test-aarch64.sh [TEST FILTER (default: quant)]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
cargo test --locked -p rserve-backend --no-default-features --lib --target aarch64-unknown-linux-gnu "${1:-quant}"
