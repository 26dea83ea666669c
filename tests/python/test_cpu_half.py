"""The CPU backend in 16 bits over HTTP: SmolLM2 served with `--dtype bfloat16`, its KV cache in float16
(`--kv-cache-dtype`) and one compute thread (`--cpu-threads 1`) answers a completion whose greedy text and first
log-probs agree with the float32 server's, and start-up names the cache's type and the thread count; fp8 is refused
at start-up. CPU only: the device runs (`RSERVE_E2E_ARGS`) skip it."""

import os
import subprocess

import pytest

from conftest import MODEL_NAME, Server, model_path, rserve_bin

pytestmark = pytest.mark.skipif(os.environ.get("RSERVE_E2E_ARGS", "").strip() != "",
                                reason="16-bit weights with another KV type are the CPU backend's")

PROMPT = "The three primary colors are"


def _first_tokens(server: Server) -> tuple[str, dict[str, float]]:
    r = server.client().completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=5)
    return r.choices[0].text, r.choices[0].logprobs.top_logprobs[0]


def test_bf16_weights_f16_cache_one_thread_serve_like_float32():
    reference = Server("--device", "cpu", "--dtype", "float32", name="rserve f32")
    try:
        want_text, want_top = _first_tokens(reference)
    finally:
        reference.stop()
    half = Server("--device", "cpu", "--dtype", "bfloat16", "--kv-cache-dtype", "float16", "--cpu-threads", "1",
                  name="rserve bf16")
    try:
        got_text, got_top = _first_tokens(half)
        log = half.log(200)
        assert "float16 keys and values" in log and "cpu (1 threads)" in log, log
    finally:
        half.stop()
    # bf16 weights move SmolLM2's log-probs by a few hundredths; a broken cache or matmul moves them by whole nats.
    best = max(want_top, key=want_top.get)
    assert best in got_top and abs(got_top[best] - want_top[best]) < 0.1, (got_top, want_top)
    assert got_text.split()[:1] == want_text.split()[:1], (got_text, want_text)


def test_an_fp8_kv_cache_is_refused_at_start_up():
    r = subprocess.run([str(rserve_bin()), str(model_path()), "--port", "0", "--kv-cache-dtype", "fp8"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "RUST_LOG": "error"})
    assert r.returncode == 1 and "--kv-cache-dtype fp8 is not supported" in r.stderr, (r.returncode, r.stderr)
