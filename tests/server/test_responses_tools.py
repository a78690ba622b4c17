"""/v1/responses with the tools Codex CLI sends by default: function tools grouped in a
``namespace`` tool (a call comes back with its ``namespace``) and built-in tools the server cannot
run (left out, and said so), through the real server and the official openai SDK."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_api_server import KEY, MODEL, fake_server

API_KEY = "agent-test-key"  # the agent_server fixture's (conftest.py)
SPAWN = {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent on a task",
         "parameters": {"type": "object", "properties": {"task": {"type": "string",
                                                                  "maxLength": 24}},
                        "required": ["task"], "additionalProperties": False}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1",
          "description": "Tools for spawning and managing sub-agents.", "tools": [SPAWN]}
WEB_SEARCH = {"type": "web_search", "external_web_access": False}


@pytest.fixture(scope="module")
def client(agent_server):
    return openai.OpenAI(base_url=f"{agent_server.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_namespace_tool_call_round_trip(client, model):
    r = client.responses.create(model=model, input="Start a sub-agent that writes tests.",
                                tools=[AGENTS], tool_choice="required", max_output_tokens=60,
                                temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and {(c.name, c.namespace) for c in calls} == {("spawn_agent", "multi_agent_v1")}
    call = calls[0]
    assert isinstance(json.loads(call.arguments)["task"], str)
    # Codex's way: the whole history each turn, the call item with its namespace
    items = [{"type": "message", "role": "user", "content": "Start a sub-agent."},
             call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "agent 7 runs"}]
    r2 = client.responses.create(model=model, input=items, tools=[AGENTS], store=False,
                                 max_output_tokens=12)
    assert r2.status in ("completed", "incomplete") and r2.output
    # and the stored way: the call goes back into the history under the name the model used
    r3 = client.responses.create(model=model, previous_response_id=r.id, tools=[AGENTS],
                                 input=[{"type": "function_call_output", "call_id": c.call_id,
                                         "output": "agent 7 runs"} for c in calls],
                                 max_output_tokens=12)
    assert r3.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens // 2


def test_streamed_namespace_call_names_its_namespace(client, model):
    stream = client.responses.create(model=model, input="Start a sub-agent.", tools=[AGENTS],
                                     tool_choice={"type": "function", "name": "spawn_agent",
                                                  "namespace": "multi_agent_v1"},
                                     max_output_tokens=60, stream=True)
    events = list(stream)
    (done,) = [e for e in events if e.type == "response.output_item.done"]
    assert (done.item.name, done.item.namespace) == ("spawn_agent", "multi_agent_v1")
    assert events[-1].response.output[0].namespace == "multi_agent_v1"


def test_built_in_tools_are_left_out_and_named(client, model, agent_server):
    r = client.responses.create(model=model, input="Start a sub-agent.", max_output_tokens=60,
                                tools=[SPAWN, WEB_SEARCH, {"type": "code_interpreter",
                                                           "container": {"type": "auto"}}],
                                tool_choice="required")
    assert r.output[0].name == "spawn_agent"  # the model was offered the function alone
    assert r.model_extra["dropped_tools"] == [{"index": 1, "type": "web_search"},
                                              {"index": 2, "type": "code_interpreter"}]
    assert (f"{r.id}: tools left out (the server cannot run them): tools[1] (web_search), "
            "tools[2] (code_interpreter)") in agent_server.log()
    only_built_in = client.responses.create(model=model, input="hi", tools=[WEB_SEARCH],
                                            max_output_tokens=4)
    assert only_built_in.model_extra["dropped_tools"] == [{"index": 0, "type": "web_search"}]


def test_the_flag_restores_the_400():
    with fake_server(2, reject_unsupported_tools=True) as srv:
        body = {"model": MODEL, "input": "hi", "tools": [SPAWN, WEB_SEARCH]}
        r = httpx.post(f"{srv.url}/v1/responses", json=body,
                       headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1].type"
        body["tools"] = [{**AGENTS, "tools": [SPAWN, {"type": "custom", "name": "apply"}]}]
        r = httpx.post(f"{srv.url}/v1/responses", json=body,
                       headers={"authorization": f"Bearer {KEY}"})
        assert r.json()["error"]["param"] == "tools[0].tools[1].type"


@pytest.mark.parametrize("tool, param", [
    ({"type": "namespace", "tools": [SPAWN]}, "tools[0].name"),
    ({"type": "namespace", "name": "ns"}, "tools[0].tools"),
    ({"type": "namespace", "name": "ns", "tools": [{"type": "function"}]},
     "tools[0].tools[0].name"),
])
def test_malformed_namespace_is_a_400_naming_it(tool, param):
    with fake_server(2) as srv:
        r = httpx.post(f"{srv.url}/v1/responses", headers={"authorization": f"Bearer {KEY}"},
                       json={"model": MODEL, "input": "hi", "tools": [tool]})
        assert r.status_code == 400 and r.json()["error"]["param"] == param


@pytest.mark.parametrize("value, param, message", [
    (5, "input", "input: must be a string or a list"),
    ([5], "input[0]", "input[0]: must be an object"),
])
def test_a_type_error_in_input_names_input(value, param, message):
    with fake_server(2) as srv:
        r = httpx.post(f"{srv.url}/v1/responses", headers={"authorization": f"Bearer {KEY}"},
                       json={"model": MODEL, "input": value})
        assert r.status_code == 400
        assert (r.json()["error"]["param"], r.json()["error"]["message"]) == (param, message)
