#!/usr/bin/env bash
# setup-tests.sh — what the test suite needs beyond serving (scripts/setup.sh): the device backends' toolchains and
# runtimes (SPIR-V build, Intel's OpenCL CPU runtime, the Level Zero loader and null driver, Open MPI: one script
# each in scripts/setup.d, run in name order) and a Python venv with the openai client for the end-to-end tests.
# Idempotent. scripts/test.sh runs it.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! python3 -c "import ensurepip, venv" 2>/dev/null; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends python3-venv
fi

for s in scripts/setup.d/*.sh; do
  [ -e "$s" ] || continue
  bash "$s"
done

if [ ! -x .venv/bin/pytest ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q -r tests/python/requirements.txt
fi
echo "test setup done"
