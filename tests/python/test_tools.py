"""Tool calling through the official `openai` client: `tool_choice="required"` and a named function always give calls
whose arguments validate against the function's schema (`jsonschema`), greedy and sampled, n=2; streamed tool-call
deltas reassemble to the non-streamed call; `finish_reason` is "tool_calls" (required) or "stop" (named), as vLLM
reports them; "auto" (the shared server runs `--enable-auto-tool-choice --tool-call-parser hermes`) passes text that
is no call through unchanged; bad tool requests are 400s naming the field."""

import json

import jsonschema
import openai
import pytest

from conftest import MODEL_NAME

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 16}}, "required": ["timezone"],
        "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a timezone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def ask(client, **kw):
    kw.setdefault("max_tokens", 100)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, **kw)


def check_calls(calls):
    assert calls, "at least one call"
    for c in calls:
        assert c.type == "function" and c.id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_required_always_calls_a_tool(client, temperature):
    r = ask(client, tool_choice="required", temperature=temperature, n=2, seed=5)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content in ("", None)
        check_calls(choice.message.tool_calls)


def test_required_without_parallel_calls_gives_one(client):
    r = ask(client, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=9)
    assert len(r.choices[0].message.tool_calls) == 1
    check_calls(r.choices[0].message.tool_calls)


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_named_function_is_called_with_valid_arguments(client, name):
    r = ask(client, tool_choice={"type": "function", "function": {"name": name}})
    c = r.choices[0]
    assert c.finish_reason == "stop"  # OpenAI and vLLM report "stop" for a named tool choice
    assert [t.function.name for t in c.message.tool_calls] == [name]
    check_calls(c.message.tool_calls)


def reassemble(stream):
    calls, finish = {}, None
    for chunk in stream:
        for ch in chunk.choices:
            # OpenAI's form: one entry per call index in a delta (code reading delta.tool_calls[0] sees it all).
            indices = [d.index for d in ch.delta.tool_calls or []]
            assert len(indices) == len(set(indices)), ch.delta.tool_calls
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    entry["id"] = d.id
                if d.function and d.function.name:
                    entry["name"] += d.function.name
                if d.function and d.function.arguments:
                    entry["arguments"] += d.function.arguments
            finish = ch.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_deltas_reassemble_to_the_non_streamed_call(client, tool_choice):
    r = ask(client, tool_choice=tool_choice)
    streamed, finish = reassemble(ask(client, tool_choice=tool_choice, stream=True))
    want = [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls]
    assert [(c["name"], c["arguments"]) for c in streamed] == want
    assert all(c["id"] and c["id"].startswith("chatcmpl-tool-") for c in streamed)
    assert finish == r.choices[0].finish_reason


def test_auto_passes_plain_answers_through(client):
    r = ask(client, max_tokens=24)  # tools without tool_choice: "auto" on this server
    c = r.choices[0]
    text = c.message.content or ""
    if not c.message.tool_calls:
        plain = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                               max_tokens=24, temperature=0,
                                               extra_body={"skip_special_tokens": False})
        assert text == plain.choices[0].message.content
        assert c.finish_reason in ("stop", "length")
    streamed = ""
    for chunk in ask(client, max_tokens=24, stream=True):
        for ch in chunk.choices:
            streamed += ch.delta.content or ""
    assert streamed.strip() == text.strip()


@pytest.mark.parametrize("kw,param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_tool_requests_are_400(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, **kw)
    assert e.value.body["param"] == param, e.value.body


def test_tool_choice_without_tools_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tool_choice="required", max_tokens=4)
    assert e.value.body["param"] == "tool_choice"


def test_a_multi_turn_tool_conversation_is_served(client):
    # user -> tool call -> tool result -> answer; the exact rendering is checked against transformers in
    # engine/tests/chat_template_tools.rs (Llama 3.1 and Qwen2.5 templates).
    first = ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, tool_choice="none",
                                       max_tokens=16, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.usage.prompt_tokens > first.usage.prompt_tokens
    bad = messages[:1] + [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, messages=bad, max_tokens=4)
    assert e.value.body["param"].startswith("messages[1].tool_calls[0].function"), e.value.body
