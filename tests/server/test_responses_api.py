"""OpenAI's Responses API (/v1/responses) through the real server, with the official openai SDK
and LangChain's ChatOpenAI(use_responses_api=True)."""

from __future__ import annotations

import json
import threading

import httpx
import jsonschema
import openai
import pytest

API_KEY = "agent-test-key"  # the agent_server fixture's (conftest.py)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                    "maxLength": 16}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(agent_server):
    return openai.OpenAI(base_url=f"{agent_server.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_text_response_is_stored_and_deleted(client, model):
    r = client.responses.create(model=model, input="Say hello.", max_output_tokens=12,
                                metadata={"k": "v"}, temperature=0)
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.metadata == {"k": "v"}
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    got = client.responses.retrieve(r.id)
    assert got.output_text == r.output_text and got.id == r.id
    assert client.responses.delete(r.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_stream_events_are_typed_and_numbered(client, model):
    stream = client.responses.create(model=model, input="Name three colors.",
                                     max_output_tokens=16, stream=True, temperature=0)
    events = list(stream)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for kind in ("response.output_item.added", "response.content_part.added",
                 "response.output_text.done", "response.output_item.done"):
        assert kind in types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens > 0
    whole = client.responses.create(model=model, input="Name three colors.",
                                    max_output_tokens=16, temperature=0)
    assert whole.output_text == text


def test_tool_call_and_result_round_trip_with_previous_response_id(client, model):
    r = client.responses.create(model=model, input="What is the weather in Paris?",
                                tools=[WEATHER], tool_choice="required", max_output_tokens=60)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert call.call_id and call.status == "completed"
    r2 = client.responses.create(model=model, previous_response_id=r.id, tools=[WEATHER],
                                 input=[{"type": "function_call_output", "call_id": call.call_id,
                                         "output": "sunny, 21 C"}], max_output_tokens=16)
    assert r2.previous_response_id == r.id and r2.output_text
    # the conversation so far was computed by the first request: its prefix is reused
    assert r2.usage.input_tokens > r.usage.input_tokens
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens // 2


def test_stateless_tool_result_turn(client, model):
    """Codex's way: store false and the whole history, function_call items included, each turn."""
    items = [{"type": "message", "role": "user", "content": "Weather in Oslo?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "snow"}]
    r = client.responses.create(model=model, input=items, tools=[WEATHER], store=False,
                                max_output_tokens=12)
    assert r.output_text and r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_streamed_function_call_arguments(client, model):
    stream = client.responses.create(model=model, input="Weather in Rome?", tools=[WEATHER],
                                     tool_choice={"type": "function", "name": "get_weather"},
                                     max_output_tokens=60, stream=True)
    events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == deltas and json.loads(deltas)["city"]
    assert events[-1].response.output[0].arguments == deltas


def test_text_format_json_schema(client, model):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0,
                                                       "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.responses.create(model=model, input="Invent a person.", max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "person",
                                                 "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    r = client.responses.create(model=model, input="Give a JSON object.", max_output_tokens=40,
                                text={"format": {"type": "json_object"}})
    assert r.status == "incomplete" or isinstance(json.loads(r.output_text), dict)


@pytest.mark.parametrize("extra, param", [
    ({"background": True}, "background"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"previous_response_id": "resp_missing"}, "previous_response_id"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"max_output_token": 5}, "max_output_token"),
])
def test_unsupported_is_a_400_naming_it(client, model, extra, param):
    body = {"model": model, "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/responses", body=body, cast_to=httpx.Response)
    assert e.value.body["param"] == param


def test_cancel_stops_an_in_progress_response(agent_server, client, model):
    stream = client.responses.create(model=model, input="Count from 1 to 500, one per line.",
                                     max_output_tokens=1500, stream=True, temperature=0)
    events, cancelled = [], []
    for event in stream:
        events.append(event)
        if event.type == "response.output_text.delta" and not cancelled:
            rid = events[0].response.id
            cancelled.append(threading.Thread(target=client.post,
                                              args=(f"/responses/{rid}/cancel",),
                                              kwargs={"cast_to": httpx.Response}))
            cancelled[0].start()
    cancelled[0].join()
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "cancelled"
    assert client.responses.retrieve(rid).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # only an in-progress response can be cancelled
        client.post(f"/responses/{rid}/cancel", cast_to=httpx.Response)


def test_langchain_chat_openai_responses_api(agent_server, model):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=f"{agent_server.url}/v1", api_key=API_KEY,
                     use_responses_api=True, max_tokens=16, max_retries=0)
    reply = llm.invoke("Say hi.")
    assert reply.text and reply.usage_metadata["input_tokens"] > 0
    chunks = list(llm.stream("Say hi."))
    assert "".join(c.text for c in chunks)
    tool_llm = llm.model_copy(update={"max_tokens": 60}).bind_tools([WEATHER],
                                                                     tool_choice="get_weather")
    msg = tool_llm.invoke("Weather in Lima?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
