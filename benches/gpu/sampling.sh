#!/usr/bin/env bash
# benches/gpu/sampling.sh — sampled against greedy requests on an NVIDIA GPU, one server, back to back: the
# Llama-3.1-8B shape (bf16, dummy weights, Llama 3's tokenizer), 128 in / 128 out, at 1, 64 and 256 clients, each
# greedy (temperature 0) then sampled (temperature 0.7, top_p 0.9); prints output tok/s, TPOT and the ratio.
#
# Needs target/release/rserve (built on any machine; no CUDA toolkit). Env: RSERVE_TEST_MODELS (default
# ./models/x), OUT (default /tmp/rserve-gpu-sampling), PORT (8012), CONCURRENCY ("1 64 256"), SERVER_FLAGS (more
# `rserve serve` flags, e.g. `--profile graph`: the server log then holds the device-busy share of decode steps).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rserve-gpu-sampling}
mkdir -p "$OUT"
BIN=target/release/rserve
PORT=${PORT:-8012}
MODELS=${RSERVE_TEST_MODELS:-$PWD/models/x}
export RSERVE_CACHE_DIR=${RSERVE_CACHE_DIR:-/tmp/rserve-cache}
# shellcheck source=lib.sh
. benches/gpu/lib.sh
M=$(dummy_8b_model "$MODELS")
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
start_server "$OUT/server.log" "$M" --device cuda --load-format dummy --dtype bfloat16 \
  --max-model-len 2048 --max-num-seqs 256 --kv-cache-memory-bytes "${KV_BYTES:-40000000000}" ${SERVER_FLAGS:-} || exit 1
echo "server ready in ${STARTED_IN} s"
bench() { # name clients prompts sampling-flags...
  local name=$1 c=$2 n=$3; shift 3
  timeout "${BENCH_TIMEOUT:-200}" "$BIN" bench serve --port "$PORT" --tokenizer "$M" --dataset-name random \
    --random-input-len 128 --random-output-len 128 --num-prompts "$n" --max-concurrency "$c" --ignore-eos "$@" \
    --save-result --result-dir "$OUT" --result-filename "$name.json" > "$OUT/$name.log" 2>&1
  python3 -c "import json; d=json.load(open('$OUT/$name.json')); print(f\"{d['output_throughput']:.1f} {d['mean_tpot_ms']:.2f}\")"
}
bench warmup 64 128 --temperature 0.7 --top-p 0.9 > /dev/null
printf '| clients | greedy tok/s | TPOT ms | sampled tok/s | TPOT ms | sampled / greedy |\n| --- | --- | --- | --- | --- | --- |\n'
for c in ${CONCURRENCY:-1 64 256}; do
  n=$(( c == 1 ? 8 : 2 * c ))
  read -r g gt < <(bench "greedy-c$c" "$c" "$n" --temperature 0)
  read -r s st < <(bench "sampled-c$c" "$c" "$n" --temperature 0.7 --top-p 0.9)
  printf '| %s | %s | %s | %s | %s | %.3f |\n' "$c" "$g" "$gt" "$s" "$st" "$(python3 -c "print($s/$g)")"
done
kill "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
grep -iE "error|panic" "$OUT/server.log" | head -5
