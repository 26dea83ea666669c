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

# (Re)installed when the requirements changed since the venv last took them.
if [ ! -x .venv/bin/pytest ] || ! cmp -s tests/python/requirements.txt .venv/requirements.installed; then
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install -q -r tests/python/requirements.txt
  cp tests/python/requirements.txt .venv/requirements.installed
fi
echo "test setup done"
