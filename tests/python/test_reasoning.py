"""Reasoning parsers through the official `openai` client: a server per `--reasoning-parser` (deepseek_r1, qwen3,
deepseek_v3, mistral, gpt_oss), driven by a prefilled assistant turn (`continue_final_message`) that repeats one line
holding the parser's markers, so that SmolLM2 (greedy) writes that line once more and stops at the newline. Each
answer must come back split into `reasoning` (vLLM's field name) and `content`, streamed or not; harmony's tool call
comes back in `tool_calls`; tool parsing reads only the text after the reasoning; `include_reasoning: false` drops
the reasoning; `enable_thinking: false` (Qwen3) and DeepSeek V3 without `thinking` give all content; a bad
`reasoning_effort` is a 400 naming the field."""

import json

import openai
import pytest

from conftest import MODEL_NAME, Server

THINK = "<think>one two</think>three four"
MISTRAL = "[THINK]one two[/THINK]three four"
HARMONY = ("<|channel|>analysis<|message|>one two<|end|><|start|>assistant<|channel|>final<|message|>"
           "three four<|return|>")
HARMONY_CALL = ("<|channel|>analysis<|message|>one two<|end|><|start|>assistant<|channel|>commentary "
                "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>")
HERMES = "<think>one two</think><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def prefilled(line: str) -> list[dict]:
    """A conversation whose last (assistant) message repeats `line` after a `L:` label, ending with the label (the
    continued message is cut after its trimmed text, so it cannot end with the newline). A `<think>` line keeps its
    `<think>` in the prompt, as the templates of those models open the reasoning there (and a prompt whose last marker
    is `</think>` has closed the reasoning, which vLLM reads as no reasoning to split)."""
    opened = "<think>" if line.startswith("<think>") else ""
    return [{"role": "user", "content": "Repeat the line."},
            {"role": "assistant", "content": "".join(f"L:{line}\n" for _ in range(4)) + "L:" + opened}]


def ask(client, line: str, stream: bool = False, **kw):
    kw.setdefault("max_tokens", 80)
    extra = kw.pop("extra_body", {})
    return client.chat.completions.create(
        model=MODEL_NAME, messages=prefilled(line), temperature=0, stop=["\n"], stream=stream,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, **extra}, **kw)


def streamed(client, line: str, **kw) -> tuple[str | None, str | None, list[dict]]:
    """The stream's reasoning, content and tool-call deltas, each side concatenated (None when it got nothing)."""
    reasoning, content, calls = [], [], []
    for chunk in ask(client, line, stream=True, **kw):
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            if delta.get("reasoning"):
                reasoning.append(delta["reasoning"])
            if delta.get("content"):
                content.append(delta["content"])
            indices = [c["index"] for c in delta.get("tool_calls") or []]
            assert len(indices) == len(set(indices)), f"one entry per call index: {delta}"
            calls.extend(delta.get("tool_calls") or [])
    return "".join(reasoning) or None, "".join(content) or None, calls


@pytest.fixture(scope="module", params=["deepseek_r1", "qwen3", "deepseek_v3", "mistral", "gpt_oss"])
def parser_server(request):
    s = Server("--reasoning-parser", request.param, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               name=f"{request.param} server")
    yield request.param, s
    s.stop()


def line_for(parser: str) -> str:
    return {"mistral": MISTRAL, "gpt_oss": HARMONY}.get(parser, THINK)


def kwargs_for(parser: str) -> dict:
    # DeepSeek V3 reads reasoning only when the request turns thinking on.
    return {"extra_body": {"chat_template_kwargs": {"thinking": True}}} if parser == "deepseek_v3" else {}


def test_reasoning_and_content_are_split(parser_server):
    parser, server = parser_server
    r = ask(server.client(), line_for(parser), **kwargs_for(parser))
    message = r.choices[0].message
    assert (message.reasoning, message.content) == ("one two", "three four"), message
    assert r.choices[0].finish_reason == "stop"


def test_streamed_deltas_add_up_to_the_split(parser_server):
    parser, server = parser_server
    assert streamed(server.client(), line_for(parser), **kwargs_for(parser))[:2] == ("one two", "three four")


def test_include_reasoning_false_drops_the_reasoning(parser_server):
    parser, server = parser_server
    kw = kwargs_for(parser)
    kw.setdefault("extra_body", {})["include_reasoning"] = False
    message = ask(server.client(), line_for(parser), **kw).choices[0].message
    assert (message.reasoning, message.content) == (None, "three four")


def test_thinking_off_is_all_content(parser_server):
    parser, server = parser_server
    if parser not in ("qwen3", "deepseek_v3"):
        pytest.skip("only Qwen3 and DeepSeek V3 read a thinking switch")
    kw = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}} if parser == "qwen3" else {}
    message = ask(server.client(), THINK, **kw).choices[0].message
    assert (message.reasoning, message.content) == (None, THINK.removeprefix("<think>"))


def test_tool_calls_are_read_after_the_reasoning(parser_server):
    parser, server = parser_server
    line = HARMONY_CALL if parser == "gpt_oss" else HERMES
    if parser in ("mistral", "deepseek_v3"):
        pytest.skip("covered by deepseek_r1, qwen3 and gpt_oss")
    r = ask(server.client(), line, tools=TOOLS, max_tokens=120)
    message = r.choices[0].message
    assert message.reasoning == "one two"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == \
        [("get_weather", {"city": "Paris"})]
    assert r.choices[0].finish_reason == "tool_calls"
    reasoning, _, calls = streamed(server.client(), line, tools=TOOLS, max_tokens=120)
    assert reasoning == "one two"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("effort", ["bogus", 3])
def test_a_bad_reasoning_effort_is_400(parser_server, effort):
    _, server = parser_server
    with pytest.raises(openai.BadRequestError) as e:
        ask(server.client(), THINK, extra_body={"reasoning_effort": effort})
    assert e.value.response.json()["error"]["param"] == "reasoning_effort"


def test_a_known_reasoning_effort_is_accepted(parser_server):
    parser, server = parser_server
    r = ask(server.client(), line_for(parser), reasoning_effort="low", **kwargs_for(parser))
    assert r.choices[0].message.content == "three four"


def test_structured_outputs_apply_after_the_reasoning(parser_server):
    parser, server = parser_server
    if parser not in ("deepseek_r1", "qwen3"):
        pytest.skip("one grammar test per marker style is enough")
    r = ask(server.client(), "<think>one two</think>1234", max_tokens=12,
            extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    message = r.choices[0].message
    assert message.reasoning == "one two"
    assert message.content is not None and len(message.content) == 3 and message.content.isdigit(), message
