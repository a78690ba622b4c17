"""Gemma's tool calls through a real server and the official clients, one tiny model per format
whose weights make its greedy answer a call of ``get_weather`` (``helpers.gemma_tools_model``):

- Gemma 4, whose chat template teaches ``<|tool_call>call:NAME{...}<tool_call|>``;
- Gemma 3, a template in Gemma 3's shape (no tool support: the server describes the tools in a
  system message) and a ```` ```tool_code ```` block for an answer.

The server must pick the family's parser (``gemma4``, ``gemma3``) from the template and return the
call as a tool call on chat completions (whole and streamed), the Responses API and (Gemma 4) the
Anthropic Messages API; then render the call and the tool's result into the next prompt (Gemma 3:
in alternating turns, as its template demands), whose answer (forced by a grammar) comes back as
content."""

from __future__ import annotations

import json

import pytest

from helpers.gemma_tools_model import ANSWER, make_gemma3_tools_model, make_gemma4_tools_model
from helpers.server_utils import served_model, start_server

pytestmark = pytest.mark.slow
ARGS = {"city": "Paris"}
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
MODELS = {"gemma4": make_gemma4_tools_model, "gemma3": make_gemma3_tools_model}


@pytest.fixture(scope="module", params=list(MODELS))
def server(request, tmp_path_factory):
    model = MODELS[request.param](tmp_path_factory.mktemp(f"{request.param}_tools"))
    srv = start_server(str(model), "--num-pages", "2048",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    srv.family = request.param
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


def test_chat_round_trip(client):
    model = served_model(client)
    r1 = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, temperature=0)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGS
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r2 = client.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                        temperature=0, max_tokens=64,
                                        extra_body={"guided_choice": [ANSWER]})
    # the call went back into the prompt in Gemma's syntax, the result after it
    assert r2.usage.prompt_tokens > r1.usage.prompt_tokens + 12
    msg = r2.choices[0].message
    assert (msg.content, r2.choices[0].finish_reason, msg.tool_calls) == (ANSWER, "stop", None)


def test_without_tools_the_block_is_text(server, client):
    if server.family != "gemma3":
        pytest.skip("Gemma 3's tool_code block")
    r = client.chat.completions.create(model=served_model(client), messages=ASK, temperature=0)
    assert r.choices[0].message.content == '```tool_code\nget_weather(city="Paris")\n```'
    assert r.choices[0].message.tool_calls is None


def test_chat_streamed(client):
    args, names, content, reasons = "", [], "", []
    for chunk in client.chat.completions.create(model=served_model(client), messages=ASK,
                                                tools=TOOLS, temperature=0, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                names += [d.function.name] if d.function.name else []
                args += d.function.arguments or ""
            reasons.append(c.finish_reason)
    assert names == ["get_weather"] and json.loads(args) == ARGS and not content
    assert reasons[-1] == "tool_calls"


def test_responses_api(client):
    tool = {"type": "function", **TOOLS[0]["function"]}
    r = client.responses.create(model=served_model(client), input="Weather in Paris?", tools=[tool],
                                temperature=0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == ARGS


def test_anthropic_messages(server, client):
    if server.family != "gemma4":
        pytest.skip("checked on Gemma 4's format")
    anthropic = pytest.importorskip("anthropic")
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused").messages
    tool = {"name": "get_weather", "description": "Weather of a city", "input_schema": PARAMS}
    m = messages.create(model=served_model(client), max_tokens=64, messages=ASK, tools=[tool],
                        extra_body={"temperature": 0})
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == ARGS and m.stop_reason == "tool_use"
