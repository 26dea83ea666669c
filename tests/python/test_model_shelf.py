"""The model shelf through the real interface: `rserve` serves each tiny random-weight checkpoint (Qwen3, Gemma 2,
Gemma 3, Phi-3 with LongRoPE, Mistral with its sliding window, gpt-oss with its MXFP4 experts and attention sinks;
made at setup by scripts/reference/tiny_models.py)
and the official client's greedy completion of a golden prompt, given as token ids, is transformers' 32 tokens
(tests/fixtures/golden/tiny/*.json). The Gemma 3 prompt is more than 8 windows long, so its local layers run
from freed blocks; its `/metrics` then shows the cache back to empty.
"""

import json
import os
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
    server = Server("--max-model-len", "256", "--block-size", "8", "--max-num-batched-tokens", "64", "--max-num-seqs", "8",
                    model=folder, name=f"rserve {name}")
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
