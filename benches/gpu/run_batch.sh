#!/usr/bin/env bash
# benches/gpu/run_batch.sh — offline batch throughput on a GPU (issue #26): `rserve run-batch` over PROMPTS completion
# requests against the same load through the server with `rserve bench serve` at CONCURRENCY clients, on the
# Llama-3.1-8B shape with dummy bf16 weights (benches/gpu/lib.sh). The batch file holds /v1/completions lines whose
# prompts are IN_LEN random token ids (seeded) with max_tokens OUT_LEN, ignore_eos and temperature 0, which is what
# `bench serve --dataset-name random` sends. run-batch's figure is its output tokens (the answers' usage) over its
# wall time from start to exit, model load excluded (the log's "Application startup complete." is not printed by
# run-batch, so the load is timed by a run over a one-line file and subtracted). Needs target/release/rserve.
# Env: RSERVE_TEST_MODELS (./models/x), OUT (/tmp/rserve-gpu-batch), PORT (8014), DEVICE (cuda), PROMPTS (2000),
#      CONCURRENCY (256), IN_LEN (128), OUT_LEN (128), KV_BYTES (40e9).
set -u
cd "$(dirname "$0")/../.."
. benches/gpu/lib.sh
OUT=${OUT:-/tmp/rserve-gpu-batch}
mkdir -p "$OUT"
PORT=${PORT:-8014}
N=${PROMPTS:-2000}
C=${CONCURRENCY:-256}
MODELS=${RSERVE_TEST_MODELS:-$PWD/models/x}
m=$(dummy_8b_model "$MODELS")
FLAGS=(--device "${DEVICE:-cuda}" --load-format dummy --dtype bfloat16 --max-model-len 2048 --max-num-seqs 256
       --kv-cache-memory-bytes "${KV_BYTES:-40000000000}" --no-enable-prefix-caching)
python3 - "$OUT/in.jsonl" "$N" "${IN_LEN:-128}" "${OUT_LEN:-128}" <<'PY'
import json, random, sys
path, n, in_len, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rnd = random.Random(0)
with open(path, "w") as f:
    for i in range(n):
        body = {"model": "m", "prompt": [rnd.randrange(1000, 120000) for _ in range(in_len)], "max_tokens": out_len,
                "ignore_eos": True, "temperature": 0}
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
PY
head -1 "$OUT/in.jsonl" > "$OUT/one.jsonl"
sed -i 's/"model": "m"/"model": "'"${m//\//\\/}"'"/' "$OUT/in.jsonl" "$OUT/one.jsonl"
rm -f "$OUT/out.jsonl" "$OUT/one.out.jsonl"
t0=$(date +%s.%N)
target/release/rserve run-batch -i "$OUT/one.jsonl" -o "$OUT/one.out.jsonl" "$m" "${FLAGS[@]}" > "$OUT/load.log" 2>&1
t1=$(date +%s.%N)
target/release/rserve run-batch -i "$OUT/in.jsonl" -o "$OUT/out.jsonl" "$m" "${FLAGS[@]}" > "$OUT/run-batch.log" 2>&1
t2=$(date +%s.%N)
python3 - "$OUT/out.jsonl" "$t0" "$t1" "$t2" "$N" <<'PY' | tee "$OUT/summary.txt"
import json, sys
path, t0, t1, t2, n = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
lines = [json.loads(l) for l in open(path)]
ok = [l for l in lines if l["response"] and l["response"]["status_code"] == 200]
toks = sum(l["response"]["body"]["usage"]["completion_tokens"] for l in ok)
load = t1 - t0
run = (t2 - t1) - load
print(f"run-batch: {len(lines)} lines ({len(ok)} answered) of {n}, {toks} output tokens; wall {t2 - t1:.1f} s, "
      f"of which ~{load:.1f} s start-up (a one-line run) -> {toks / run:.1f} output tok/s")
PY
: > "$OUT/server.log"
start_server "$OUT/server.log" "$m" "${FLAGS[@]}" || exit 1
target/release/rserve bench serve --port "$PORT" --tokenizer "$m" --dataset-name random --random-input-len "${IN_LEN:-128}" \
  --random-output-len "${OUT_LEN:-128}" --num-prompts "$C" --max-concurrency "$C" --ignore-eos --temperature 0 > /dev/null 2>&1
target/release/rserve bench serve --port "$PORT" --tokenizer "$m" --dataset-name random --random-input-len "${IN_LEN:-128}" \
  --random-output-len "${OUT_LEN:-128}" --num-prompts "$N" --max-concurrency "$C" --ignore-eos --temperature 0 \
  > "$OUT/bench-serve.log" 2>&1
kill "$SERVER"; wait "$SERVER" 2>/dev/null
echo "bench serve at $C clients: $(grep -E 'Output token throughput' "$OUT/bench-serve.log") ($(grep -E 'Benchmark duration' "$OUT/bench-serve.log"))" | tee -a "$OUT/summary.txt"
