"""Structured outputs through the official `openai` client: `parse()` with a Pydantic model, `json_object`,
`json_schema` (nested objects, arrays, enums, required, anyOf), vLLM's `structured_outputs` (regex, choice, a Lark and
an EBNF grammar) and the older `guided_*` fields, on chat and completions, greedy and sampled, streamed and not,
n=2. Every output that finished with "stop" is checked with `jsonschema` / `re`; none is compared with a hard-coded
text. Bad specs are 400s that name their field."""

import json
import re
from enum import Enum

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from conftest import MODEL_NAME

MAX_TOKENS = 120

# Small bounds keep a 135M model's answers short enough to finish.
NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"enum": ["France", "Spain", "Italy"]},
        "population": {"type": "integer", "minimum": 0},
        "districts": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "mayor": {"anyOf": [{"type": "null"},
                            {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}},
                             "required": ["name"], "additionalProperties": False}]},
    },
    "required": ["city", "country", "population", "districts", "mayor"],
    "additionalProperties": False,
}
PROMPT = "Describe a European city as JSON."


def chat(client, **kw):
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("temperature", 0)
    messages = kw.pop("messages", [{"role": "user", "content": PROMPT}])
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, **kw)


def stream_texts(stream) -> tuple[dict[int, str], dict[int, str]]:
    texts, finish = {}, {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish


def check_json(text: str, finish: str, schema: dict):
    """A finished output validates; one cut by max_tokens is a prefix that was still valid to extend."""
    if finish == "stop":
        jsonschema.validate(json.loads(text), schema)
    else:
        assert finish == "length"
        assert text.lstrip().startswith("{"), text


JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": NESTED_SCHEMA, "strict": True}}


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_json_schema_chat_n2(client, temperature):
    r = chat(client, response_format=JSON_SCHEMA_FORMAT, n=2, temperature=temperature, seed=7)
    assert len(r.choices) == 2
    for c in r.choices:
        check_json(c.message.content, c.finish_reason, NESTED_SCHEMA)
    assert any(c.finish_reason == "stop" for c in r.choices), [c.message.content for c in r.choices]


def test_json_schema_stream_equals_non_stream(client):
    r = chat(client, response_format=JSON_SCHEMA_FORMAT)
    texts, finish = stream_texts(chat(client, response_format=JSON_SCHEMA_FORMAT, stream=True))
    assert texts[0] == r.choices[0].message.content
    assert finish[0] == r.choices[0].finish_reason
    check_json(texts[0], finish[0], NESTED_SCHEMA)


def test_json_schema_sampled_stream_n2(client):
    texts, finish = stream_texts(chat(client, response_format=JSON_SCHEMA_FORMAT, stream=True, n=2,
                                      temperature=1.0, top_p=0.95, seed=3, extra_body={"top_k": 40}))
    assert sorted(texts) == [0, 1]
    for i in (0, 1):
        check_json(texts[i], finish[i], NESTED_SCHEMA)


def test_json_object(client):
    for temperature in (0, 0.8):
        r = chat(client, response_format={"type": "json_object"}, temperature=temperature, seed=1)
        c = r.choices[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
        else:
            assert c.message.content.lstrip().startswith("{")


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Pet(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    color: Color
    friendly: bool


def test_parse_with_a_pydantic_model(client):
    r = client.chat.completions.parse(model=MODEL_NAME, max_tokens=MAX_TOKENS, temperature=0, response_format=Pet,
                                      messages=[{"role": "user", "content": "Describe a pet."}])
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet), r.choices[0].message.content
    assert 0 <= pet.age <= 30 and len(pet.name) <= 12


def test_regex_choice_and_grammars_on_chat_and_completions(client):
    regex = r"\d{3}-\d{4}"
    lark = 'start: greeting " " name "!"\ngreeting: "Hello" | "Hi"\nname: /[A-Z][a-z]{1,8}/'
    ebnf = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"'
    cases = [
        ({"structured_outputs": {"regex": regex}}, lambda t: re.fullmatch(regex, t)),
        ({"guided_regex": regex}, lambda t: re.fullmatch(regex, t)),
        ({"structured_outputs": {"choice": ["sunny", "rainy", "cloudy"]}}, lambda t: t in ("sunny", "rainy", "cloudy")),
        ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right")),
        ({"structured_outputs": {"grammar": lark}}, lambda t: re.fullmatch(r"(Hello|Hi) [A-Z][a-z]{1,8}!", t)),
        ({"guided_grammar": ebnf}, lambda t: t in ("yes.", "no.", "maybe.")),
    ]
    for extra, ok in cases:
        for temperature in (0, 1.0):
            r = chat(client, extra_body=extra, temperature=temperature, seed=11)
            c = r.choices[0]
            assert c.finish_reason == "stop" and ok(c.message.content), (extra, c.message.content)
            r = client.completions.create(model=MODEL_NAME, prompt="Answer:", max_tokens=MAX_TOKENS,
                                          temperature=temperature, seed=11, extra_body=extra)
            c = r.choices[0]
            assert c.finish_reason == "stop" and ok(c.text), (extra, c.text)


def test_completions_json_schema_stream(client):
    stream = client.completions.create(model=MODEL_NAME, prompt="A city as JSON:", max_tokens=MAX_TOKENS,
                                       temperature=0, stream=True,
                                       extra_body={"structured_outputs": {"json": NESTED_SCHEMA}})
    text, finish = "", None
    for chunk in stream:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    check_json(text, finish, NESTED_SCHEMA)


def test_sampling_parameters_apply_inside_the_constraint(client):
    # max_tokens ends first: finish_reason length, and the text is a prefix of the constrained language.
    r = chat(client, response_format=JSON_SCHEMA_FORMAT, max_tokens=5)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    assert r.choices[0].message.content.lstrip().startswith("{")
    # Log-probs are of the constrained distribution: every chosen token is finite, alternatives obey the mask.
    r = chat(client, extra_body={"guided_choice": ["alpha", "beta"]}, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    assert c.message.content in ("alpha", "beta")
    for t in c.logprobs.content:
        assert t.logprob > -1e9
        assert all(a.logprob <= t.logprob + 1e-6 or a.token == t.token for a in t.top_logprobs)
    # A seed gives the same sampled constrained output twice.
    a = chat(client, response_format={"type": "json_object"}, temperature=1.0, seed=42).choices[0].message.content
    b = chat(client, response_format={"type": "json_object"}, temperature=1.0, seed=42).choices[0].message.content
    assert a == b


@pytest.mark.parametrize("body,param", [
    ({"guided_regex": "[0-9"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "start: missing_rule"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= \"a"}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_choice": "yes"}, "guided_choice"),
])
def test_bad_specs_are_400_naming_the_field(server, client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, extra_body=body)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=4, extra_body=body)
    m = server.wait_idle()
    assert m["vllm:num_requests_running"] == 0
