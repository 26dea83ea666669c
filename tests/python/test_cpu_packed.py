"""Packed GGUF weights over HTTP: SmolLM2's Q4_1 file served packed (the CPU's default, `--cpu-packed-weights`
overriding the fixtures' `--cpu-dequantize-weights`; integer block dots against activations quantized per 32 values,
llama.cpp's scheme) answers like the dequantized float32 server (`--cpu-dequantize-weights`) within the
activation quantization: the same greedy first token where the reference is sure of it, its log-prob within 0.6
(`engine/tests/cpu_packed.rs` measured up to 0.40), and a batch of concurrent requests gets one answer per prompt,
equal to the same prompt's answer alone. CPU only: the device runs (`RSERVE_E2E_ARGS`) skip it."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import MODEL_NAME, Server

pytestmark = pytest.mark.skipif(os.environ.get("RSERVE_E2E_ARGS", "").strip() != "",
                                reason="packed GGUF weights are the CPU backend's")

PROMPTS = ["The capital of France is", "Water is made of hydrogen and", "One, two, three, four,"]


def _interleaved_kernel() -> bool:
    """Whether this CPU runs the interleaved AVX-512 VNNI kernel at every row count (elsewhere prefill batches above
    16 rows take f32 tiles, whose rounding differs from the integer kernel a short prompt alone takes)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512_vnni"))


def _first(server: Server, prompt: str) -> tuple[str, dict[str, float]]:
    r = server.client().completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0, logprobs=5)
    return r.choices[0].text, r.choices[0].logprobs.top_logprobs[0]


def _greedy(server: Server, prompt: str) -> str:
    r = server.client().completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0)
    return r.choices[0].text


def test_packed_weights_answer_like_the_dequantized_server_alone_and_batched():
    reference = Server("--device", "cpu", "--cpu-dequantize-weights", name="rserve f32")
    try:
        want = [_first(reference, p) for p in PROMPTS]
    finally:
        reference.stop()
    packed = Server("--device", "cpu", "--cpu-packed-weights", name="rserve packed")
    try:
        for prompt, (want_text, want_top) in zip(PROMPTS, want):
            got_text, got_top = _first(packed, prompt)
            best = max(want_top, key=want_top.get)
            assert best in got_top and abs(got_top[best] - want_top[best]) < 0.6, (prompt, got_top, want_top)
            runner_up = sorted(want_top.values())[-2]
            if want_top[best] - runner_up > 1.0:  # a near-tie may flip under activation quantization
                assert got_text == want_text, (prompt, got_text, want_text)
        alone = [_greedy(packed, p) for p in PROMPTS]
        with ThreadPoolExecutor(max_workers=2 * len(PROMPTS)) as pool:
            batched = list(pool.map(lambda p: _greedy(packed, p), PROMPTS * 2))
        assert all(alone), alone
        if _interleaved_kernel():
            # Each sequence's rows are quantized and multiplied on their own, so batching does not change an answer.
            assert batched == alone * 2, (batched, alone)
        else:
            assert all(batched), batched
    finally:
        packed.stop()
