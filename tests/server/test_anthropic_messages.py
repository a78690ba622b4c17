"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the real server, with
the official anthropic SDK and LangChain's ChatAnthropic."""

from __future__ import annotations

import re

import anthropic
import httpx
import pytest

API_KEY = "agent-test-key"  # the agent_server fixture's (conftest.py)

WEATHER = {"name": "get_weather", "description": "The weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string",
                                                                      "maxLength": 16}},
                            "required": ["city"], "additionalProperties": False}}
HI = [{"role": "user", "content": "Say hi."}]
GREEDY = {"temperature": 0}  # the SDK no longer has the sampling arguments


@pytest.fixture(scope="module")
def client(agent_server):
    return anthropic.Anthropic(base_url=agent_server.url, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(agent_server):
    models = httpx.get(f"{agent_server.url}/v1/models", headers={"x-api-key": API_KEY}).json()
    return models["data"][0]["id"]


def test_create_text_and_usage(client, model):
    m = client.messages.create(model=model, max_tokens=12, messages=HI, extra_body=GREEDY,
                               system=[{"type": "text", "text": "You are terse.",
                                        "cache_control": {"type": "ephemeral"}}],
                               metadata={"user_id": "u1"})
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.content[0].text and m.stop_reason in ("end_turn", "max_tokens")
    assert 0 < m.usage.output_tokens <= 12 and m.usage.cache_creation_input_tokens == 0
    counted = client.messages.count_tokens(model=model, messages=HI, system="You are terse.")
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_stream_matches_whole_message(client, model):
    kinds = []
    with client.messages.stream(model=model, max_tokens=16, messages=HI, extra_body=GREEDY) as s:
        for event in s:
            kinds.append(event.type)
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert "message_delta" in kinds
    whole = client.messages.create(model=model, max_tokens=16, messages=HI, extra_body=GREEDY)
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens > 0


def test_raw_stream_has_ping_and_named_events(agent_server, model):
    body = {"model": model, "max_tokens": 4, "messages": HI, "stream": True}
    with httpx.stream("POST", f"{agent_server.url}/v1/messages", json=body,
                      headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("event: ")]
    assert lines[:2] == ["event: message_start", "event: ping"]
    assert lines[-2:] == ["event: message_delta", "event: message_stop"]


def test_tool_use_then_tool_result(client, model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(model=model, max_tokens=60, messages=ask, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"})
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    assert use.id.startswith("toolu_") and m.stop_reason == "tool_use"
    turn = ask + [{"role": "assistant", "content": m.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": "sunny, 21 C"}]}]
    m2 = client.messages.create(model=model, max_tokens=16, messages=turn, tools=[WEATHER])
    assert m2.content and m2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert m2.usage.cache_read_input_tokens >= m.usage.input_tokens // 2


def test_streamed_tool_use_input_json(client, model):
    with client.messages.stream(model=model, max_tokens=60, tools=[WEATHER],
                                tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Weather in Rome?"}]) as s:
        parts = [e.delta.partial_json for e in s if e.type == "content_block_delta"
                 and e.delta.type == "input_json_delta"]
        final = s.get_final_message()
    assert parts and final.content[-1].type == "tool_use"
    assert final.content[-1].input["city"] and final.stop_reason == "tool_use"


def test_stop_sequence_is_reported(client, model):
    free = client.messages.create(model=model, max_tokens=24, messages=HI, extra_body=GREEDY)
    text = free.content[0].text
    stop = text.strip()[len(text.strip()) // 2:][:3]
    m = client.messages.create(model=model, max_tokens=24, messages=HI, extra_body=GREEDY,
                               stop_sequences=["@@@", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert stop not in m.content[0].text and text.startswith(m.content[0].text)


def test_billing_header_nonce_does_not_break_the_prefix_cache(client, model):
    long = "You are a careful agent. " * 40

    def ask(nonce: str):
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.0.{nonce};"
                                           f" cc_entrypoint=cli; cch={nonce};"},
                  {"type": "text", "text": long}]
        return client.messages.create(model=model, max_tokens=4, system=system, messages=HI)

    first, second = ask("a1b2c"), ask("f9e8d")
    prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert prompt == first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= prompt - 16  # all but the last page


def test_thinking_and_effort_are_accepted(client, model):
    m = client.messages.create(model=model, max_tokens=8, messages=HI,
                               thinking={"type": "enabled", "budget_tokens": 1024},
                               output_config={"effort": "high"})
    assert m.content


@pytest.mark.parametrize("body, status, fragment", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "image blocks are not supported"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "server tools"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"top_logprobs": 2}, 400, "top_logprobs"),
    ({"model": "claude-opus"}, 404, "does not exist"),
])
def test_errors_are_anthropic_shaped(agent_server, model, body, status, fragment):
    full = {"model": model, "max_tokens": 8, "messages": HI, **body}
    r = httpx.post(f"{agent_server.url}/v1/messages", json=full, headers={"x-api-key": API_KEY})
    assert r.status_code == status
    err = r.json()
    assert err["type"] == "error" and fragment in err["error"]["message"]
    assert err["error"]["type"] == ("not_found_error" if status == 404
                                    else "invalid_request_error")


# what Claude Code matches to retry with a smaller max_tokens (and to compact its conversation)
OVER_CONTEXT = re.compile(
    r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")


@pytest.mark.parametrize("stream", [False, True])
def test_context_errors_use_anthropic_wording(agent_server, model, stream):
    url, headers = f"{agent_server.url}/v1/messages", {"x-api-key": API_KEY}
    r = httpx.post(url, json={"model": model, "max_tokens": 100_000, "messages": HI,
                              "stream": stream}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    prompt, asked, limit = map(int, OVER_CONTEXT.search(r.json()["error"]["message"]).groups())
    assert asked == 100_000 and 0 < prompt < limit < asked
    retry = {"model": model, "max_tokens": limit - prompt, "messages": HI, "stream": True}
    with httpx.stream("POST", url, json=retry, headers=headers, timeout=60) as fits:
        assert fits.status_code == 200  # the retry Claude Code makes is accepted (then closed)
    long = [{"role": "user", "content": "word " * (limit + 10)}]
    r = httpx.post(url, json={"model": model, "max_tokens": 8, "messages": long}, headers=headers)
    assert r.status_code == 400
    assert re.match(r"prompt is too long: \d+ tokens > \d+ maximum", r.json()["error"]["message"])


def test_wrong_key_is_an_authentication_error(agent_server, model):
    bad = anthropic.Anthropic(base_url=agent_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=model, max_tokens=4, messages=HI)
    assert e.value.body["error"]["type"] == "authentication_error"


def test_langchain_chat_anthropic(agent_server, model):
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(model=model, base_url=agent_server.url, api_key=API_KEY,
                        max_tokens=16, max_retries=0)
    reply = llm.invoke("Say hi.")
    assert reply.text and reply.usage_metadata["input_tokens"] > 0
    assert "".join(c.text for c in llm.stream("Say hi."))
    tool_llm = llm.model_copy(update={"max_tokens": 60}).bind_tools([WEATHER],
                                                                     tool_choice="get_weather")
    msg = tool_llm.invoke("Weather in Lima?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
