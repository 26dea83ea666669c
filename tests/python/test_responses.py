"""The Responses API (`/v1/responses`) through the official `openai` client, as vLLM serves it: string and item-list
input, `instructions`; streaming events in OpenAI's order with `sequence_number`, deltas adding up to the final text
and usage on `response.completed`; function tools (`tool_choice` "required" and a named function make SmolLM2 call
them) and a second turn sending `function_call_output`; multi-turn by items and by `previous_response_id`; retrieval
by id and the 404 of an unknown one; `text.format` json_schema output that validates; reasoning items under
`--reasoning-parser` (a partial assistant message makes SmolLM2 repeat a line holding the think markers, as in
test_reasoning.py); 400s naming the field; and LangChain's `ChatOpenAI(use_responses_api=True)`. Few tokens, two
module-scoped servers, so that the file stays fast on every CI leg."""

import json
import os

import jsonschema
import openai
import pytest
import requests

from conftest import MODEL_NAME, Server

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}]
THINK = "<think>one two</think>three four"
# Request checks and the store do not depend on the device: they run once, in the plain run (scripts/test.sh repeats
# the suite with RSERVE_E2E_ARGS / _LAUNCH).
OTHER_DEVICE = bool(os.environ.get("RSERVE_E2E_ARGS", "").strip() or os.environ.get("RSERVE_E2E_LAUNCH", "").strip())
device_independent = pytest.mark.skipif(OTHER_DEVICE, reason="does not depend on the device; run once")


@pytest.fixture(scope="module")
def tool_server():
    s = Server("--enable-auto-tool-choice", "--tool-call-parser", "hermes", name="responses server")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(tool_server):
    return tool_server.client()


@pytest.fixture(scope="module")
def reasoning_server():
    s = Server("--reasoning-parser", "deepseek_r1", name="responses reasoning server")
    yield s
    s.stop()


def create(client, **kw):
    kw.setdefault("max_output_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.responses.create(model=MODEL_NAME, **kw)


def test_string_input(client):
    r = create(client, input="Say hello.", instructions="You are terse.")
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert r.instructions == "You are terse."
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output_text and r.output_text == r.output[0].content[0].text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_the_response_repeats_the_sampling_settings(client):
    r = create(client, input="Hi", temperature=0.7, top_p=0.9, extra_body={"seed": 1}, max_output_tokens=1, metadata={"k": "v"})
    assert (r.temperature, r.top_p, r.max_output_tokens, r.metadata) == (0.7, 0.9, 1, {"k": "v"})


def test_item_input_is_the_same_conversation_as_a_string(client):
    a = create(client, input="Name a color.")
    b = create(client, input=[{"type": "message", "role": "user",
                               "content": [{"type": "input_text", "text": "Name a color."}]}])
    assert a.output_text == b.output_text  # greedy: the same prompt gives the same answer


def test_streaming_events_in_order(client):
    events = list(create(client, input="Count to three.", stream=True, max_output_tokens=8))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert text and text == events[-4].text == done.output_text
    assert done.usage.output_tokens == 8 and done.status == "incomplete"
    assert client.responses.retrieve(done.id).output_text == text, "a streamed response is stored too"


def test_required_tool_call_then_its_output(client):
    r = create(client, input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
               max_output_tokens=40)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    second = create(client, tools=TOOLS, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"},
    ], tool_choice="none")
    assert second.output_text and all(o.type == "message" for o in second.output)
    assert second.tool_choice == "none"
    # The same turn by previous_response_id: the stored call comes back into the prompt, so greedy answers agree.
    third = create(client, tools=TOOLS, previous_response_id=r.id, tool_choice="none", input=[
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    assert third.output_text == second.output_text


def test_named_function_streams_its_arguments(client):
    events = list(create(client, input="Weather in Rome?", tools=TOOLS, stream=True, max_output_tokens=40,
                         tool_choice={"type": "function", "name": "get_weather"}))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments
    jsonschema.validate(json.loads(args), WEATHER)
    item = events[-1].response.output[0]
    assert item.type == "function_call" and item.name == "get_weather" and item.arguments == args


def test_previous_response_id_continues_the_conversation(client):
    first = create(client, input="My name is Ada. Say OK.")
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    follow = create(client, input="What is my name?", previous_response_id=first.id)
    assert follow.previous_response_id == first.id
    # The same conversation sent as items answers the same (greedy).
    by_items = create(client, input=[
        {"role": "user", "content": "My name is Ada. Say OK."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": "What is my name?"},
    ])
    assert follow.output_text == by_items.output_text


@device_independent
def test_unknown_ids_are_404(client, tool_server):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_unknown")
    assert e.value.body["message"] == "Response with id 'resp_unknown' not found."
    with pytest.raises(openai.NotFoundError) as e:
        create(client, input="x", previous_response_id="resp_gone")
    assert e.value.body["param"] == "previous_response_id"
    not_stored = create(client, input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(not_stored.id)
    stored = create(client, input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(stored.id)
    assert "Cannot cancel a synchronous response." in str(e.value)
    r = requests.post(f"{tool_server.url}/v1/responses/resp_unknown/cancel", headers=tool_server.headers(), timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def test_json_schema_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "sunny": {"type": "boolean"}},
              "required": ["city", "sunny"], "additionalProperties": False}
    r = create(client, input="Describe the weather in a city as JSON.", max_output_tokens=60,
               text={"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_reasoning_items(reasoning_server):
    client = reasoning_server.client()
    prefill = "".join(f"L:{THINK}\n" for _ in range(4)) + "L:<think>"
    input_ = [{"role": "user", "content": "Repeat the line."},
              {"type": "message", "role": "assistant", "status": "incomplete",
               "content": [{"type": "output_text", "text": prefill}]}]
    r = create(client, input=input_, extra_body={"stop": ["\n"]}, max_output_tokens=40, reasoning={"effort": "low"})
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"], r.output
    assert r.output[0].content[0].text == "one two"
    assert r.output_text == "three four"
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(create(client, input=input_, extra_body={"stop": ["\n"]}, max_output_tokens=40, stream=True))
    kinds = [e.type for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == "one two" == next(e.text for e in events if e.type == "response.reasoning_text.done")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "three four"
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")


@pytest.mark.parametrize("body, param", [
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"background": True}, "background"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type"),
    ({"text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "nonsense"}}}}, "text.format"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
])
@device_independent
def test_bad_fields_are_400_naming_them(client, body, param):
    body = {"input": "x", **body}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_NAME, **body)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body


def test_langchain_use_responses_api(tool_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(model=MODEL_NAME, base_url=f"{tool_server.url}/v1",
                                      api_key=tool_server.api_key, use_responses_api=True, temperature=0,
                                      max_tokens=8)
    msg = llm.invoke("Say hello.")
    # With the Responses API, LangChain gives content as a list of blocks.
    blocks = msg.content if isinstance(msg.content, list) else [{"type": "text", "text": msg.content}]
    text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict))
    assert text.strip(), msg
    assert msg.response_metadata.get("id", "").startswith("resp_"), msg.response_metadata
