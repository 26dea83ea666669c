#!/usr/bin/env bash
# benches/gpu/seeded.sh — seeded sampled requests on an NVIDIA GPU (8B shape, dummy weights): the same tokens alone,
# inside a batch of 32 mixed requests, and after preemption (a second server with about 260 tokens of KV cache). The
# GPU run of tests/python/test_sampling.py's checks, with no venv (benches/gpu/seeded.py). In float32, as the CPU and
# OpenCL suites run; then, in bfloat16, which part moves with the batch (greedy or seeded; `seeded.py diagnose`):
# 16-bit logits differ in their last bits with the batch's shape, and a sampled draw can see that where argmax
# does not.
#
# Needs target/release/rserve. Env: RSERVE_TEST_MODELS (default ./models/x), OUT (default /tmp/rserve-gpu-seeded),
# PORT (8012).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rserve-gpu-seeded}
mkdir -p "$OUT"
PORT=${PORT:-8012}
MODELS=${RSERVE_TEST_MODELS:-$PWD/models/x}
export RSERVE_CACHE_DIR=${RSERVE_CACHE_DIR:-/tmp/rserve-cache}
# shellcheck source=lib.sh
. benches/gpu/lib.sh
M=$(dummy_8b_model "$MODELS")
rc=0
start_server "$OUT/server.log" "$M" --device cuda --load-format dummy --dtype float32 --max-model-len 2048 \
  --kv-cache-memory-bytes 20000000000 || exit 1
python3 benches/gpu/seeded.py alone-and-mixed "$PORT" || rc=1
kill "$SERVER"; wait "$SERVER" 2>/dev/null
# 262,144 bytes of f32 KV a token on this shape: 68 MB hold about 260 tokens.
start_server "$OUT/small.log" "$M" --device cuda --load-format dummy --dtype float32 --max-model-len 256 \
  --block-size 16 --kv-cache-memory-bytes 68000000 || exit 1
python3 benches/gpu/seeded.py preemption "$PORT" || rc=1
kill "$SERVER"; wait "$SERVER" 2>/dev/null
echo "== bfloat16"
start_server "$OUT/bf16.log" "$M" --device cuda --load-format dummy --dtype bfloat16 --max-model-len 2048 || exit 1
python3 benches/gpu/seeded.py diagnose "$PORT"
kill "$SERVER"; wait "$SERVER" 2>/dev/null
exit $rc
