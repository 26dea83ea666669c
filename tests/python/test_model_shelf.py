"""The model shelf through the real interface: `rserve` serves each tiny random-weight checkpoint (Qwen3, Gemma 2,
Gemma 3, Phi-3 with LongRoPE, Mistral with its sliding window, gpt-oss with its MXFP4 experts and attention sinks;
made at setup by scripts/reference/tiny_models.py)
and the official client's greedy completion of a golden prompt, given as token ids, is transformers' 32 tokens
(tests/fixtures/golden/tiny/*.json). The Gemma 3 prompt is more than 8 windows long, so its local layers run
from freed blocks; its `/metrics` then shows the cache back to empty.
"""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import MODEL_NAME, Server, models_root

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "tiny"
NAMES = ["qwen3", "gemma2", "gemma3", "phi3", "mistral", "gptoss"]


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_greedy_completion_equals_transformers(name):
    if "-tp" in os.environ.get("RSERVE_E2E_ARGS", "").split():
        pytest.skip("the tiny checkpoints have 8 heads / 1-4 KV heads, which -tp 3 does not divide")
    g = golden(name)
    folder = models_root() / g["model"]["folder"]
    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"tiny checkpoint missing at {folder}: run scripts/fetch-models.sh")
    # The longest prompt (Gemma 3's is over 8 windows of 16 tokens).
    p = max(g["prompts"], key=lambda p: len(p["prompt_token_ids"]))
    # float32, as the golden's reference: on a device backend `--dtype auto` serves these bf16 checkpoints in bf16
    # (16-bit cache and activations; engine/tests/model_shelf.rs compares that path with the CPU's).
    server = Server("--max-model-len", "256", "--block-size", "8", "--max-num-batched-tokens", "64", "--max-num-seqs", "8",
                    "--dtype", "float32", model=folder, name=f"rserve {name}")
    try:
        out = server.client().completions.create(
            model=MODEL_NAME,
            prompt=p["prompt_token_ids"],
            max_tokens=len(p["greedy_token_ids"]),
            temperature=0.0,
            logprobs=1,
            extra_body={"ignore_eos": True, "skip_special_tokens": False},
        )
        choice = out.choices[0]
        assert out.usage.completion_tokens == len(p["greedy_token_ids"])
        assert out.usage.prompt_tokens == len(p["prompt_token_ids"])
        assert len(choice.logprobs.tokens) == len(p["greedy_token_ids"])
        assert choice.text == p["greedy_text"], f"{name}: {choice.text!r} != {p['greedy_text']!r}"
        # The engine frees the request's blocks right after its last step; the gauge follows within a step.
        deadline = time.monotonic() + 10
        while server.metrics().get("vllm:kv_cache_usage_perc", 0.0) != 0.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.metrics().get("vllm:kv_cache_usage_perc", 0.0) == 0.0, "every block is back in the pool"
    finally:
        server.stop()


def test_plan_equals_the_start_up_kv_cache_size():
    """One source of truth for a KV token's bytes: `rserve plan` of a bf16 checkpoint (the tiny Gemma 3, two KV cache
    groups) with the server's device kind and KV budget predicts the `KV cache size` line the server logs at start-up
    (on OpenCL and Level Zero the cache is bf16 like the model, on the CPU f32)."""
    args = os.environ.get("RSERVE_E2E_ARGS", "").split()
    if "-tp" in args:
        pytest.skip("the tiny checkpoints have 8 heads / 1-4 KV heads, which -tp 3 does not divide")
    folder = models_root() / golden("gemma3")["model"]["folder"]
    budget = ["--kv-cache-memory-bytes", "6000000", "--max-model-len", "256", "--block-size", "16"]
    on_cpu = not any(a in ("opencl", "level-zero", "cuda") or a.startswith("cuda:") for a in args)
    device = ["--device-profile", "cpu"] if on_cpu else ["--device-memory", "100000000000"]
    plan = subprocess.run([os.environ["RSERVE_BIN"], "plan", str(folder), *budget, *device],
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    tokens = re.compile(r"KV cache size: ([\d,]+) tokens")  # the server's line groups thousands (vLLM's format)
    predicted = tokens.search(plan.stdout)
    assert predicted, plan.stdout
    server = Server(*budget, model=folder, name="rserve gemma3 (plan)")
    try:
        logged = tokens.search(server.log(200))
        assert logged, server.log(200)
        assert logged.group(1).replace(",", "") == predicted.group(1).replace(",", ""), (plan.stdout, server.log(200))
    finally:
        server.stop()
