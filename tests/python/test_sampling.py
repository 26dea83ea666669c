"""Seeded sampling over HTTP: a request's draws are a function of its seed and output position (Philox, see
backend/src/sampling/philox.rs), so a seeded sampled request gives the same tokens alone, inside a batch of 32 mixed
requests (greedy, sampled, penalised, biased, with log-probs), and after it was preempted and recomputed."""

import time
from concurrent.futures import ThreadPoolExecutor

from conftest import MODEL_NAME, Server

PROMPT = "Write a short story about a lighthouse keeper and a storm."
SEEDED = dict(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=24)
OTHERS = [
    dict(temperature=0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.9, seed=5),
    dict(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.3),
    dict(temperature=1.2, min_p=0.1, extra_body={"repetition_penalty": 1.3}),
    dict(temperature=0, logit_bias={"13": 5.0}),
    dict(temperature=0.6, logprobs=3),
    dict(temperature=0.9, top_k=5, seed=99),
]


def _complete(client, prompt: str, kw: dict) -> str:
    kw = dict(kw)
    extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
    # vLLM's fields that the openai client does not know go in the body as they are.
    for field in ("top_k", "min_p"):
        if field in kw:
            extra[field] = kw.pop(field)
    kw.setdefault("max_tokens", 24)
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, extra_body=extra, **kw)
    return r.choices[0].text


def test_a_seeded_request_repeats_alone_and_inside_a_mixed_batch(client):
    alone = _complete(client, PROMPT, SEEDED)
    assert alone and alone == _complete(client, PROMPT, SEEDED)
    jobs = [(PROMPT, SEEDED)] + [(f"Item {i}: tell me about {w}.", OTHERS[i % len(OTHERS)])
                                 for i, w in enumerate(["rivers", "stars", "bread", "glass"] * 8)][:31]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        got = list(pool.map(lambda j: _complete(client, *j), jobs))
    assert got[0] == alone, (got[0], alone)
    assert all(got), got
    # Another seed draws something else.
    assert _complete(client, PROMPT, {**SEEDED, "seed": 4321}) != alone


def test_a_seeded_request_repeats_after_preemption():
    # About 260 tokens of KV cache (780 a rank under -tp 3, whose ranks hold a third of the KV heads each): twelve long
    # requests at once cannot all fit, so some are preempted and recomputed.
    s = Server("--kv-cache-memory-bytes", "12000000", "--max-model-len", "256", "--block-size", "16",
               name="small-cache server")
    try:
        client = s.client()
        alone = _complete(client, PROMPT, SEEDED)
        long = dict(temperature=0.8, max_tokens=160)
        before = s.metrics().get("vllm:num_preemptions_total", 0)
        with ThreadPoolExecutor(max_workers=13) as pool:
            others = [pool.submit(_complete, client, f"Story {i}: once upon a time", long) for i in range(12)]
            # The seeded request arrives last, so it is the first the scheduler preempts when blocks run out.
            time.sleep(1.0)
            seeded = pool.submit(_complete, client, PROMPT, SEEDED)
            got = seeded.result()
            assert all(f.result() for f in others)
        assert s.metrics().get("vllm:num_preemptions_total", 0) > before, "no request was preempted"
        assert got == alone, (got, alone)
    finally:
        assert s.stop() == 0, s.log()
