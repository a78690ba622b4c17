"""Gemma 4's tool calls through a real server and the OpenAI SDK: a tiny Gemma 4 whose chat
template teaches ``<|tool_call>call:NAME{...}<tool_call|>`` (``helpers.gemma_tools_model``), its
output forced by a grammar (``guided_choice``). The server must pick the ``gemma4`` parser from the
template, return the call as a tool call (whole and streamed), render it back into the next
prompt with the tool's result, and return the answer as content."""

from __future__ import annotations

import json

import openai
import pytest

from helpers.gemma_tools_model import make_gemma4_tools_model
from helpers.server_utils import start_server

pytestmark = pytest.mark.slow
Q = '<|"|>'
CALL = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>"
ARGS = {"city": "Paris", "days": 2}
ANSWER = "Sunny in Paris."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model = make_gemma4_tools_model(tmp_path_factory.mktemp("gemma4_tools"))
    srv = start_server(str(model), "--num-pages", "2048",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused")
    assert srv.stop() == 0


def _ask(client, messages, forced: str, **kw):
    model = client.models.list().data[0].id
    return client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                          temperature=0, max_tokens=160,
                                          extra_body={"guided_choice": [forced]}, **kw)


def test_round_trip(client):
    r1 = _ask(client, ASK, CALL)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGS
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r2 = _ask(client, history, ANSWER)
    assert r2.usage.prompt_tokens > r1.usage.prompt_tokens + len(CALL) - 10  # the call rendered
    msg = r2.choices[0].message
    assert (msg.content, r2.choices[0].finish_reason, msg.tool_calls) == (ANSWER, "stop", None)


def test_streamed(client):
    args, names, content, reasons = "", [], "", []
    for chunk in _ask(client, ASK, CALL, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            names += [d.function.name] if d.function.name else []
            args += d.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert names == ["get_weather"] and json.loads(args) == ARGS and not content
    assert reasons[-1] == "tool_calls"
