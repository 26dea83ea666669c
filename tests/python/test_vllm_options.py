"""vLLM's request options beyond OpenAI's that change the output, through the official client (`extra_body`):
`include_stop_str_in_output`, `allowed_token_ids`, `bad_words`, `truncate_prompt_tokens`, and the chat options
`echo`, `continue_final_message`, `chat_template_kwargs`. Each check compares two requests or checks a property;
no expected text is hard-coded."""

from conftest import MODEL_NAME

PROMPT = "Write one sentence about the sea."
STORY = "Once upon a time, in a small village by the sea,"


def complete(client, **kw):
    """A greedy completion of STORY that runs to max_tokens (ignore_eos), with extra vLLM fields."""
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
    return client.completions.create(model=MODEL_NAME, prompt=kw.pop("prompt", STORY), extra_body=extra, **kw)


def test_include_stop_str_in_output(client):
    full = complete(client).choices[0].text
    # A stop string taken from the greedy answer itself: cut without the option, kept with it.
    stop = full.strip().split()[1]
    cut = complete(client, stop=[stop]).choices[0]
    kept = complete(client, stop=[stop], extra_body={"include_stop_str_in_output": True}).choices[0]
    assert cut.finish_reason == kept.finish_reason == "stop"
    assert kept.text == cut.text + stop
    assert full.startswith(kept.text)


def test_allowed_token_ids_limit_the_output(client):
    ids = tokens(client, " sea")
    r = complete(client, max_tokens=6, extra_body={"allowed_token_ids": [ids[0]]}).choices[0]
    token = client.post("/../detokenize", cast_to=object, body={"model": MODEL_NAME, "tokens": [ids[0]]})["prompt"]
    assert r.text == token * 6


def tokens(client, text):
    return client.post("/../tokenize", cast_to=object, body={"model": MODEL_NAME, "prompt": text,
                                                             "add_special_tokens": False})["tokens"]


def test_bad_words_are_never_generated(client):
    full = complete(client, max_tokens=32).choices[0].text
    # A word of the greedy answer that is one token alone and after a space: vLLM bans both forms then.
    word = next(w for w in full.split() if w.isalpha() and len(w) > 2 and len(tokens(client, w)) == 1
                and len(tokens(client, " " + w)) == 1)
    banned = complete(client, max_tokens=32, extra_body={"bad_words": [word]}).choices[0].text
    assert word not in banned.split(), (word, banned)
    assert banned != full


def test_truncate_prompt_tokens_keeps_the_last_tokens(client):
    r = complete(client, max_tokens=2, extra_body={"truncate_prompt_tokens": 3})
    assert r.usage.prompt_tokens == 3
    whole = complete(client, max_tokens=2)
    assert whole.usage.prompt_tokens > 3


def test_chat_echo_and_continue_final_message(client):
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My favourite colour is"}]
    cont = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0,
                                          extra_body={"continue_final_message": True, "add_generation_prompt": False,
                                                      "echo": True})
    text = cont.choices[0].message.content
    assert text.startswith("My favourite colour is") and len(text) > len("My favourite colour is")
    fresh = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
    assert cont.usage.prompt_tokens < fresh.usage.prompt_tokens  # no end of turn, no new assistant header
    chunks = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0,
                                            stream=True, extra_body={"continue_final_message": True,
                                                                     "add_generation_prompt": False, "echo": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_chat_template_kwargs_reach_the_template(client):
    # SmolLM2's template reads no extra variable: the answer is unchanged, and the request is accepted.
    a = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
                                       temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    b = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
                                       temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
