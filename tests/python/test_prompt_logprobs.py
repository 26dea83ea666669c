"""Prompt log-probs end to end (issue #46 item 3): `echo` with `logprobs` on /v1/completions (with `max_tokens` 0 and
1, streamed and not) and vLLM's `prompt_logprobs` field on both routes. Each prompt token's log-prob equals
transformers' float32 log-softmax (tests/fixtures/golden/smollm2_prompt_logprobs.json, written by
scripts/reference/prompt_logprob_refs.py) within 1e-3 nats: served alone, again after its prefix is cached, with a
prompt that shares a cached prefix, and on a server whose chunked prefill splits every prompt into 32-token chunks.
"""

import json
import os
from pathlib import Path

import pytest
import requests

from conftest import MODEL_NAME, Server

GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "golden" /
                     "smollm2_prompt_logprobs.json").read_text())["prompts"]
TOLERANCE = 1e-3
# The request and response shapes do not depend on the device: they run once, in the plain run (scripts/test.sh
# repeats the suite with RSERVE_E2E_ARGS / _LAUNCH); the scores themselves run on every device.
OTHER_DEVICE = bool(os.environ.get("RSERVE_E2E_ARGS", "").strip() or os.environ.get("RSERVE_E2E_LAUNCH", "").strip())
device_independent = pytest.mark.skipif(OTHER_DEVICE, reason="does not depend on the device; run once")
# One more server start costs a minute on the OpenCL CPU runtime: chunked prefill runs on the CPU and under MPI.
not_on_opencl = pytest.mark.skipif("opencl" in os.environ.get("RSERVE_E2E_ARGS", ""), reason="CPU and TP=3 cover it")


def echo_scores(client, ids: list[int], max_tokens: int = 0, **kw):
    r = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=max_tokens, echo=True, logprobs=1,
                                  temperature=0, **kw)
    return r.choices[0]


def assert_matches_golden(scores: list, golden: dict, where: str):
    want = golden["logprobs"]
    assert len(scores) >= len(want), where
    assert scores[0] is None, where
    worst = max(abs(a - b) for a, b in zip(scores[1:len(want)], want[1:]))
    assert worst < TOLERANCE, f"{where}: worst prompt log-prob error {worst:.2e} nats"


@pytest.mark.parametrize("which", range(len(GOLDEN)))
def test_echo_logprobs_equal_transformers(client, which):
    g = GOLDEN[which]
    choice = echo_scores(client, g["ids"])
    lp = choice.logprobs
    assert len(lp.tokens) == len(g["ids"])
    assert lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    assert_matches_golden(lp.token_logprobs, g, f"prompt {which}")
    assert choice.finish_reason == "length"
    # The prompt alone: nothing generated, and the scores in vLLM's prompt_logprobs form too.
    extra = choice.model_extra["prompt_logprobs"]
    assert extra[0] is None and len(extra) == len(g["ids"])
    for pos in range(1, len(g["ids"])):
        entry = extra[pos][str(g["ids"][pos])]
        assert abs(entry["logprob"] - g["logprobs"][pos]) < TOLERANCE
        best = min(extra[pos].values(), key=lambda e: e["rank"] or 1 << 30)
        assert best["rank"] == 1
        top = [int(k) for k, v in extra[pos].items() if v["rank"] == 1][0]
        # The best token is transformers' best, unless the two are tied within the tolerance.
        theirs = extra[pos].get(str(g["top1"][pos]))
        tied = theirs is not None and abs(theirs["logprob"] - extra[pos][str(top)]["logprob"]) < TOLERANCE
        assert top == g["top1"][pos] or tied, pos


def test_cached_prefix_gives_the_same_scores(server, client):
    long, shared = GOLDEN[1], GOLDEN[2]
    first = echo_scores(client, long["ids"]).logprobs.token_logprobs
    before = server.metrics().get("vllm:prefix_cache_hits_total", 0)
    # The same prompt again, then one sharing its first 64 tokens: their blocks are cached by now.
    again = echo_scores(client, long["ids"]).logprobs.token_logprobs
    other = echo_scores(client, shared["ids"]).logprobs.token_logprobs
    assert_matches_golden(again, long, "the cached prompt")
    assert_matches_golden(other, shared, "a prompt with a cached prefix")
    assert max(abs(a - b) for a, b in zip(first[1:], again[1:])) < 1e-5
    # Prompt log-probs need every position's logits: such requests compute their prompt (vLLM's rule).
    assert server.metrics().get("vllm:prefix_cache_hits_total", 0) == before


@device_independent
def test_max_tokens_one_adds_the_generated_token(client):
    g = GOLDEN[0]
    choice = echo_scores(client, g["ids"], max_tokens=1)
    lp = choice.logprobs
    assert len(lp.tokens) == len(g["ids"]) + 1
    assert_matches_golden(lp.token_logprobs, g, "echo with max_tokens 1")
    assert lp.token_logprobs[-1] is not None and lp.token_logprobs[-1] <= 0
    assert choice.finish_reason == "length"


@device_independent
def test_streamed_echo_carries_the_prompt_scores(client):
    g = GOLDEN[0]
    stream = client.completions.create(model=MODEL_NAME, prompt=g["ids"], max_tokens=2, echo=True, logprobs=0,
                                       temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    first = chunks[0].choices[0]
    assert first.logprobs.token_logprobs[0] is None
    assert_matches_golden(first.logprobs.token_logprobs, g, "streamed echo")
    scored = sum(len(c.choices[0].logprobs.tokens) for c in chunks if c.choices[0].logprobs)
    assert scored == len(g["ids"]) + 2


@device_independent
def test_prompt_logprobs_field_on_both_routes(server, client):
    g = GOLDEN[0]
    r = requests.post(f"{server.url}/v1/completions", headers=server.headers(),
                      json={"model": MODEL_NAME, "prompt": g["ids"], "max_tokens": 1, "prompt_logprobs": 2,
                            "temperature": 0})
    assert r.status_code == 200, r.text
    pl = r.json()["choices"][0]["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(g["ids"])
    # The prompt token and its two best alternatives (fewer when the token is one of them).
    assert all(2 <= len(e) <= 3 for e in pl[1:])
    assert_matches_golden([None] + [e[str(t)]["logprob"] for e, t in zip(pl[1:], g["ids"][1:])], g, "completions")
    chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=1, extra_body={"prompt_logprobs": 0})
    pl = chat.model_extra["prompt_logprobs"]
    assert pl[0] is None and chat.usage.prompt_tokens == len(pl)
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in pl[1:])


@device_independent
def test_prompt_logprobs_errors_name_the_field(server):
    for body, status in [({"prompt_logprobs": 100000}, 400), ({"prompt_logprobs": -3}, 400),
                         ({"prompt_logprobs": 1, "stream": True}, 400)]:
        r = requests.post(f"{server.url}/v1/completions", headers=server.headers(),
                          json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1, **body})
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == "prompt_logprobs", r.text
    r = requests.post(f"{server.url}/v1/completions", headers=server.headers(),
                      json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


@pytest.fixture(scope="module")
def chunked():
    s = Server("--max-num-batched-tokens", "32", "--max-num-seqs", "4", name="chunked")
    yield s
    s.stop()


@not_on_opencl
def test_chunked_prefill_gives_the_same_scores(chunked):
    client = chunked.client()
    long = GOLDEN[1]
    assert_matches_golden(echo_scores(client, long["ids"]).logprobs.token_logprobs, long, "chunked prefill")
    # Mixed with a request that generates meanwhile.
    g = GOLDEN[0]
    assert_matches_golden(echo_scores(client, g["ids"], max_tokens=3).logprobs.token_logprobs, g, "chunked, short")
