"""Harmony (gpt-oss's chat format): prompts rendered from OpenAI chats, and the model's output read
back into reasoning, tool calls and content, whole and token by token; the o200k_base vocabulary
supplied offline."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from minisgl.tokenizer.harmony import O200K_SHA256, VOCAB_ENV, Harmony, supply_vocabulary

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    return Harmony(str(tmp_path_factory.mktemp("cache")))


def assistant_tokens(harmony, messages) -> list[int]:
    """What the model would write: each message rendered by openai-harmony, the first without
    the ``<|start|>assistant`` that ends the prompt."""
    tokens = []
    for m in messages:
        tokens += harmony.encoding.render(m)
    return tokens[2:]


def test_vocabulary_is_supplied_offline(tmp_path, monkeypatch):
    monkeypatch.delenv(VOCAB_ENV, raising=False)
    where = supply_vocabulary(str(tmp_path))
    with open(os.path.join(where, "o200k_base.tiktoken"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == O200K_SHA256
    assert os.environ[VOCAB_ENV] == where
    monkeypatch.setenv(VOCAB_ENV, "/elsewhere")
    assert supply_vocabulary(str(tmp_path)) == "/elsewhere"


def test_render_system_developer_tools_effort_and_tool_results(harmony):
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "sunny"}'}]
    text = harmony.encoding.decode_utf8(harmony.render(chat, TOOLS, {"reasoning_effort": "high"}))
    assert "Reasoning: high" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe brief." in text
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in text
    assert ("<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
            '<|message|>{"city": "Paris"}<|call|>') in text
    assert ('<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
            '{"sky": "sunny"}<|end|>') in text
    assert "Need the tool." in text  # reasoning before a tool call is kept
    assert text.endswith("<|start|>assistant")
    low = harmony.encoding.decode_utf8(harmony.render(chat[1:2], None, {"reasoning_effort": "low"}))
    assert "Reasoning: low" in low and "developer" not in low
    assert "Reasoning: medium" in harmony.encoding.decode_utf8(harmony.render(chat[1:2]))


def test_render_errors_name_the_field(harmony):
    with pytest.raises(ValueError, match="reasoning_effort"):
        harmony.render([{"role": "user", "content": "hi"}], None, {"reasoning_effort": "huge"})
    with pytest.raises(ValueError, match=r"messages\[1\].tool_call_id"):
        harmony.render([{"role": "user", "content": "hi"},
                        {"role": "tool", "tool_call_id": "nope", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        harmony.render([{"role": "user", "content": [{"type": "image_url"}]}])


def test_round_trip_reasoning_tool_call_then_answer(harmony):
    """Turn 1: reasoning and a tool call; turn 2 (after the tool's result): the answer. Streamed
    token by token, the deltas add up to the whole message."""
    oh = harmony.oh
    turn1 = assistant_tokens(harmony, [
        oh.Message.from_role_and_content(oh.Role.ASSISTANT, "I should call get_weather.")
        .with_channel("analysis"),
        oh.Message.from_role_and_content(oh.Role.ASSISTANT, '{"city":"Paris"}')
        .with_channel("commentary").with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json")])
    whole, reason = harmony.stream().message(turn1, "stop")
    assert reason == "tool_calls"
    assert whole["reasoning_content"] == "I should call get_weather." and whole["content"] is None
    (call,) = whole["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}

    stream, reasoning, args, names = harmony.stream(), "", "", []
    for i in range(len(turn1)):
        delta, reason = stream.delta(turn1[: i + 1], "stop" if i == len(turn1) - 1 else None)
        reasoning += delta.get("reasoning_content", "")
        assert "content" not in delta
        for c in delta.get("tool_calls", []):
            names += [c["function"]["name"]] if "name" in c["function"] else []
            args += c["function"]["arguments"]
    assert (reasoning, args, names, reason) == ("I should call get_weather.", '{"city":"Paris"}',
                                                ["get_weather"], "tool_calls")

    turn2 = assistant_tokens(harmony, [
        oh.Message.from_role_and_content(oh.Role.ASSISTANT, "It is sunny.")
        .with_channel("analysis"),
        oh.Message.from_role_and_content(oh.Role.ASSISTANT, "Sunny in Paris.")
        .with_channel("final")])
    msg, reason = harmony.stream().message(turn2, "stop")
    assert msg == {"role": "assistant", "content": "Sunny in Paris.",
                   "reasoning_content": "It is sunny."}
    assert reason == "stop"
    # the answer's turn renders with the whole exchange: tool call, result, then the answer
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call["id"], "type": "function", "function": call["function"]}]},
            {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"sky": "sunny"})},
            msg]
    text = harmony.encoding.decode_utf8(harmony.render(chat, TOOLS))
    assert '<|call|><|start|>functions.get_weather to=assistant' in text
    assert text.endswith("<|channel|>final<|message|>Sunny in Paris.<|end|><|start|>assistant")


def test_output_off_the_format_is_kept_as_content(harmony):
    tokens = harmony.encoding.encode("plain words", allowed_special=set())
    msg, reason = harmony.stream().message(tokens, "length")
    assert msg["content"] == "plain words" and reason == "length"
