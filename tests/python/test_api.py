"""The OpenAI API through the official `openai` client: chat and completions, streaming and not, n=2, stop strings,
log-probs, usage in streams, echo, token-id prompts, /v1/models, /tokenize and /detokenize, /health, /version,
/metrics. Expected texts are never hard-coded: each check compares two ways of asking for the same greedy output, or
checks a property (stop string absent, counts consistent)."""

import math

import requests

from conftest import MAX_MODEL_LEN, MODEL_NAME, chat_text, stream_chat_text

PROMPT = "Write one sentence about the sea."


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    card = models.data[0]
    assert card.object == "model"
    assert card.model_extra.get("max_model_len") == MAX_MODEL_LEN


def test_chat_completion_shape(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=16, temperature=0)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == MODEL_NAME
    assert r.created > 1_600_000_000
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant"
    assert c.message.content
    assert c.finish_reason in ("stop", "length")
    assert 1 <= r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 16


def test_chat_stream_equals_non_stream(client):
    text, finish = chat_text(client, PROMPT, max_tokens=32)
    streamed, stream_finish = stream_chat_text(client, PROMPT, max_tokens=32)
    assert streamed == text
    assert stream_finish == finish


def test_chat_stream_chunk_shapes(client):
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                                 max_tokens=8, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(ch.usage is None for ch in chunks)
    assert all(ch.choices[0].delta.role is None for ch in chunks[1:])
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1])


def test_content_part_arrays_equal_string_content(client):
    r1 = client.chat.completions.create(model=MODEL_NAME, temperature=0, max_tokens=16,
                                        messages=[{"role": "user", "content": PROMPT}])
    r2 = client.chat.completions.create(model=MODEL_NAME, temperature=0, max_tokens=16,
                                        messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}])
    assert r1.choices[0].message.content == r2.choices[0].message.content
    assert r1.usage.prompt_tokens == r2.usage.prompt_tokens


def test_completions_shape_and_stream(client):
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert r.id.startswith("cmpl-")
    assert r.object == "text_completion"
    assert r.model == MODEL_NAME
    assert r.choices[0].text
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                            stream=True))
    assert all(ch.object == "text_completion" for ch in chunks)
    assert "".join(ch.choices[0].text for ch in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_max_tokens_length_finish(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_default_max_tokens_is_rest_of_context(client):
    # No max_tokens: the request is accepted and may use the rest of the context (it ends at EOS here).
    r = client.chat.completions.create(model=MODEL_NAME, temperature=0,
                                       messages=[{"role": "user", "content": "Say yes."}])
    assert r.usage.completion_tokens <= MAX_MODEL_LEN - r.usage.prompt_tokens
    assert r.choices[0].finish_reason in ("stop", "length")


def test_n2_chat_and_completions(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=12, n=2, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)
    again = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=12, n=2, temperature=1.0, seed=7)
    # The same seed gives the same choices again.
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]

    chunks = list(client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=6, n=2, stream=True,
                                            temperature=0.8, seed=3))
    finished = {c.index: c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason}
    assert set(finished) == {0, 1}


def test_list_of_prompts_gives_one_choice_each(client):
    prompts = ["One, two,", "Red, green,"]
    r = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    for i, p in enumerate(prompts):
        single = client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=6, temperature=0)
        assert r.choices[i].text == single.choices[0].text


def test_stop_strings(client):
    full, _ = chat_text(client, PROMPT, max_tokens=48, extra_body={"ignore_eos": True})
    assert len(full) > 12, full
    stop = full[len(full) // 2: len(full) // 2 + 3]
    expected = full[: full.index(stop)]
    text, finish = chat_text(client, PROMPT, max_tokens=48, stop=[stop], extra_body={"ignore_eos": True})
    assert finish == "stop"
    assert stop not in text
    assert text == expected
    streamed, stream_finish = stream_chat_text(client, PROMPT, max_tokens=48, stop=stop,
                                               extra_body={"ignore_eos": True})
    assert (streamed, stream_finish) == (expected, "stop")


def test_stop_strings_completions(client):
    prompt = "The days of the week are Monday,"
    full = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=32, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=32, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(stop)]


def test_stop_reason_as_vllm(server, client):
    # vLLM's stop_reason: the id (a number) for a stop token id, the string for a stop string, null for EOS.
    prompt = "The days of the week are Monday,"
    full = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    ids = requests.post(f"{server.url}/tokenize", timeout=30,
                        json={"model": MODEL_NAME, "prompt": full, "add_special_tokens": False}).json()["tokens"]
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"stop_token_ids": [ids[0]]}).choices[0]
    assert (r.finish_reason, r.model_extra["stop_reason"], r.text) == ("stop", ids[0], "")
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0, stop=[full[2:4]],
                                  extra_body={"ignore_eos": True}).choices[0]
    assert (r.finish_reason, r.model_extra["stop_reason"]) == ("stop", full[2:4])
    c = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi."}],
                                       max_tokens=200, temperature=0).choices[0]
    assert (c.finish_reason, c.model_extra["stop_reason"]) == ("stop", None)
    # Streamed, the choice's last chunk carries it.
    full, _ = chat_text(client, PROMPT, max_tokens=24, extra_body={"ignore_eos": True})
    stop = full[len(full) // 2: len(full) // 2 + 3]
    last = [ch.choices[0] for ch in client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0,
        stream=True, stop=[stop], extra_body={"ignore_eos": True}) if ch.choices and ch.choices[0].finish_reason]
    assert [(c.finish_reason, c.model_extra["stop_reason"]) for c in last] == [("stop", stop)]


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and math.isfinite(t.logprob)
        assert len(t.top_logprobs) == 3
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert t.token == t.top_logprobs[0].token
        assert abs(t.logprob - lps[0]) < 1e-4
        assert bytes(t.bytes) == t.token.encode()
    assert "".join(t.token for t in content) == r.choices[0].message.content


def test_chat_logprobs_stream(client):
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                                 max_tokens=6, temperature=0, logprobs=True, stream=True))
    tokens = [t for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.content]
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert tokens and "".join(t.token for t in tokens) == text


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL_NAME, prompt="The capital of France is", max_tokens=8,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)
    for tok, tok_lp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tok_lp <= 0
        assert 1 <= len(top) <= 3
        assert max(top.values()) == top[tok] or abs(max(top.values()) - tok_lp) < 1e-4
    assert "".join(lp.tokens) == r.choices[0].text


def test_stream_include_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                                 max_tokens=8, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    plain = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=8, temperature=0)
    assert text == plain.choices[0].message.content
    assert last.usage.completion_tokens == plain.usage.completion_tokens
    assert last.usage.prompt_tokens == plain.usage.prompt_tokens

    chunks = list(client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=4, stream=True, n=2,
                                            stream_options={"include_usage": True}, temperature=0,
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 2 * 4


def test_echo(client):
    prompt = "Roses are red,"
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0)
    assert r.choices[0].text == prompt + plain.choices[0].text


def test_token_id_prompts_equal_text_prompts(server, client):
    prompt = "Roses are red,"
    tok = requests.post(f"{server.url}/tokenize", json={"model": MODEL_NAME, "prompt": prompt}, timeout=30).json()
    by_text = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=MODEL_NAME, prompt=tok["tokens"], max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == tok["count"]
    two = client.completions.create(model=MODEL_NAME, prompt=[tok["tokens"], tok["tokens"]], max_tokens=8,
                                    temperature=0)
    assert [c.text for c in two.choices] == [by_text.choices[0].text] * 2


def test_tokenize_detokenize_round_trip(server, client):
    text = "Hello, world! Ünïcödé and emoji 🚀 survive."
    tok = requests.post(f"{server.url}/tokenize", json={"prompt": text, "add_special_tokens": False,
                                                        "return_token_strs": True}, timeout=30)
    assert tok.status_code == 200, tok.text
    body = tok.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] == MAX_MODEL_LEN
    assert len(body["token_strs"]) == body["count"]
    det = requests.post(f"{server.url}/detokenize", json={"tokens": body["tokens"]}, timeout=30)
    assert det.status_code == 200, det.text
    assert det.json() == {"prompt": text}

    messages = [{"role": "user", "content": PROMPT}]
    tok = requests.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=30).json()
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1, temperature=0)
    assert tok["count"] == r.usage.prompt_tokens


def test_health_version_metrics(server):
    h = requests.get(f"{server.url}/health", timeout=30)
    assert h.status_code == 200
    v = requests.get(f"{server.url}/version", timeout=30)
    assert v.status_code == 200 and v.json()["version"]
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
                 "vllm:num_preemptions_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                 "rserve:kv_blocks_used", "rserve:kv_blocks_total"]:
        assert f'{name}{{model_name="{MODEL_NAME}"' in text, name
    m = server.metrics()
    assert m["rserve:kv_blocks_total"] > 0
    before = m["vllm:generation_tokens_total"]

    def finished(reason):
        line = f'vllm:request_success_total{{model_name="{MODEL_NAME}",engine="0",finished_reason="{reason}"}} '
        text = requests.get(f"{server.url}/metrics", timeout=30).text
        return float(next(x for x in text.splitlines() if x.startswith(line)).rpartition(" ")[2])

    length_before = finished("length")
    requests.post(f"{server.url}/v1/completions", headers=server.headers(),
                  json={"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}, timeout=120).raise_for_status()
    assert server.metrics()["vllm:generation_tokens_total"] >= before + 3
    assert finished("length") >= length_before + 1
