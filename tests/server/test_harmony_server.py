"""gpt-oss's harmony through a real server and the official clients: a tiny gpt-oss whose weights
make its greedy output a harmony exchange (``helpers.harmony_model``: a tool call, then reasoning
and the answer) runs behind the server; the OpenAI SDK's chat completions (whole and streamed),
the Responses API and the Anthropic Messages API must each get the reasoning as reasoning, the
call as a tool call and the answer as content."""

from __future__ import annotations

import json

import openai
import pytest

from helpers.harmony_model import ANSWER, ARGS, REASONING, TOOLS, make_harmony_model
from helpers.server_utils import served_model, start_server

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Weather in Paris?"}]
RESULT = json.dumps({"sky": "sunny"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_harmony_model(tmp_path_factory.mktemp("harmony_model"))
    srv = start_server(str(model), "--num-pages", "4096",
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def test_chat_round_trip(client):
    model = served_model(client)
    r1 = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                        reasoning_effort="high", temperature=0)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", ARGS)
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    r2 = client.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                        temperature=0)
    msg = r2.choices[0].message
    assert (msg.content, msg.model_extra["reasoning_content"]) == (ANSWER, REASONING)
    assert r2.choices[0].finish_reason == "stop" and not msg.tool_calls


def test_chat_round_trip_streamed(client):
    model = served_model(client)
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                                temperature=0, stream=True):
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            assert not c.delta.content
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": "", "args": ""})
                entry["name"] += tc.function.name or ""
                entry["args"] += tc.function.arguments or ""
    assert list(calls.values())[0]["name"] == "get_weather"
    assert calls[0]["args"] == ARGS and reasons[-1] == "tool_calls"
    history = ASK + [{"role": "assistant", "tool_calls": [{
        "id": calls[0]["id"], "type": "function",
        "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": RESULT}]
    content, reasoning = "", ""
    for chunk in client.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                                temperature=0, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
    assert (content, reasoning) == (ANSWER, REASONING)


def test_reasoning_effort_and_forced_tool_choice_are_checked(client):
    model = served_model(client)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=ASK, reasoning_effort="huge")
    assert e.value.body["param"] == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                       tool_choice="required")
    assert e.value.body["param"] == "tool_choice"


def test_responses_api_round_trip(client):
    model = served_model(client)
    tool = {"type": "function", **TOOLS[0]["function"]}
    r1 = client.responses.create(model=model, input="Weather in Paris?", tools=[tool],
                                 reasoning={"effort": "low"}, temperature=0)
    (call,) = [o for o in r1.output if o.type == "function_call"]
    assert (call.name, call.arguments) == ("get_weather", ARGS)
    r2 = client.responses.create(model=model, previous_response_id=r1.id, tools=[tool],
                                 input=[{"type": "function_call_output", "call_id": call.call_id,
                                         "output": RESULT}], temperature=0)
    assert r2.output_text == ANSWER
    (reasoning,) = [o for o in r2.output if o.type == "reasoning"]
    assert REASONING in json.dumps(reasoning.model_dump())


def test_anthropic_messages_round_trip(server):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    model = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x").models.list().data[0].id
    tool = {"name": "get_weather", "description": "Weather of a city",
            "input_schema": TOOLS[0]["function"]["parameters"]}
    greedy = {"temperature": 0}
    m1 = client.messages.create(model=model, max_tokens=64, messages=ASK, tools=[tool],
                                extra_body=greedy)
    (use,) = [b for b in m1.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == json.loads(ARGS)
    assert m1.stop_reason == "tool_use"
    m2 = client.messages.create(model=model, max_tokens=64, tools=[tool], extra_body=greedy,
                                messages=[
        *ASK, {"role": "assistant", "content": [b.model_dump() for b in m1.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": RESULT}]}])
    assert [b.text for b in m2.content if b.type == "text"] == [ANSWER]
    thinking = [b for b in m2.content if b.type == "thinking"]
    assert thinking and thinking[0].thinking == REASONING
