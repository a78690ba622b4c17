"""The agent APIs' translation pieces without a server: Claude Code's billing header, the
response store's bound and lifetime, the builders' events against their whole answers, and the
context-window opt-in."""

from __future__ import annotations

import json
import time

import pytest

from minisgl.engine.window import window
from minisgl.models.config import ModelConfig
from minisgl.server.agents.anthropic_stream import MessageBuilder
from minisgl.server.agents.chat_bridge import strip_billing_header
from minisgl.server.agents.responses_input import input_messages
from minisgl.server.agents.responses_store import ResponseStore, Stored
from minisgl.server.agents.responses_stream import ResponseBuilder
from minisgl.server.openai.errors import ApiError

CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]},
    {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_ab", "type": "function",
         "function": {"name": "f", "arguments": ""}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": '{"x": '}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": "1}"}}]}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 9,
                              "prompt_tokens_details": {"cached_tokens": 32}}},
]


def test_billing_header_lines_are_removed_and_nothing_else():
    text = ("x-anthropic-billing-header: cc_version=2.1.9.abc; cc_entrypoint=cli; cch=1f2e3;\n"
            "You are Claude Code.\nx-anthropic-billing-header is a header name.")
    assert strip_billing_header(text) == ("You are Claude Code.\n"
                                          "x-anthropic-billing-header is a header name.")
    assert strip_billing_header("plain") == "plain"


def test_store_bound_and_lifetime():
    store = ResponseStore(max_entries=2, ttl_s=60)
    for rid in ("a", "b"):
        store.put(rid, Stored({"id": rid}))
    assert store.get("a") is not None  # a is now the most recently used
    store.put("c", Stored({"id": "c"}))
    assert store.get("b") is None and len(store) == 2
    assert store.get("a") is not None and store.get("c") is not None
    short = ResponseStore(max_entries=8, ttl_s=0.05)
    short.put("a", Stored({"id": "a"}))
    time.sleep(0.1)
    assert short.get("a") is None and len(short) == 0


def test_response_events_rebuild_the_whole_response():
    b = ResponseBuilder({"id": "resp_1"}, summary=True, encrypted=True, count=len)
    events = b.start() + [e for c in CHUNKS for e in b.feed(c)] + b.finish()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and final["status"] == "completed"
    kinds = [o["type"] for o in final["output"]]
    assert kinds == ["reasoning", "message", "function_call"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    args = "".join(e["delta"] for e in events
                   if e["type"] == "response.function_call_arguments.delta")
    assert final["output"][1]["content"][0]["text"] == text == "Hello"
    assert final["output"][2]["arguments"] == args and json.loads(args) == {"x": 1}
    assert final["output"][0]["summary"][0]["text"] == "think"
    assert final["output"][0]["encrypted_content"] == "think"
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 32
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert all(e["item"]["status"] == "in_progress" for e in added)
    assert b.history() == {"role": "assistant", "content": "Hello", "reasoning_content": "think",
                           "tool_calls": [{"id": "call_ab", "type": "function",
                                           "function": {"name": "f", "arguments": '{"x": 1}'}}]}


def test_message_events_rebuild_the_whole_message():
    b = MessageBuilder("m", prompt_tokens=50, cached_tokens=32)
    events = b.start() + [e for c in CHUNKS for e in b.feed(c)] + b.finish()
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert events[0]["message"]["usage"]["cache_read_input_tokens"] == 32
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    blocks = b.message["content"]
    assert [x["type"] for x in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[2]["input"] == {"x": 1} and blocks[2]["id"] == "toolu_ab"
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert starts == stops == [0, 1, 2]
    assert b.message["usage"] == {"input_tokens": 18, "cache_creation_input_tokens": 0,
                                  "cache_read_input_tokens": 32, "output_tokens": 9}


def test_input_items_become_chat_messages():
    items = [{"type": "message", "role": "developer", "content": "rules"},
             {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    assert input_messages(items) == [
        {"role": "system", "content": "rules"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "reasoning_content": "hmm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    with pytest.raises(ApiError) as e:
        input_messages([{"type": "item_reference", "id": "x"}])
    assert e.value.param == "input[0].type"


def test_window_beyond_the_model_is_an_explicit_opt_in(monkeypatch, default_model_dir):
    mc = ModelConfig.from_path(default_model_dir)
    assert mc.max_position == 8192
    monkeypatch.delenv("MINISGL_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    assert window(mc, 4096) is mc
    with pytest.raises(ValueError, match="MINISGL_ALLOW_LONG_MAX_MODEL_LEN"):
        window(mc, 32768)
    monkeypatch.setenv("MINISGL_ALLOW_LONG_MAX_MODEL_LEN", "1")
    long = window(mc, 32768)
    assert long.max_position == long.rotary.max_position == 32768


# ------------------------------------------------------------------------------ keep-alives
class _Run:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_agent_stream_sends_keepalives_while_silent_and_cancels_on_close(monkeypatch):
    import asyncio

    from minisgl.server.agents.chat_bridge import AgentStream

    monkeypatch.setattr(AgentStream, "KEEPALIVE_S", 0.05)
    cleaned: list[bool] = []

    async def events():
        try:
            yield {"type": "a"}
            await asyncio.sleep(0.3)  # a held-back tool call, a long prefill
            yield {"type": "b"}
            await asyncio.sleep(60)
            yield {"type": "never"}
        finally:
            cleaned.append(True)

    async def consume() -> list[str]:
        body = AgentStream(events(), _Run(), keepalive="PING").body_iterator
        out = []
        async for chunk in body:
            out.append(chunk)
            if chunk.startswith("event: b"):
                break
        await body.aclose()  # the client went away while the next event was pending
        await asyncio.sleep(0)
        return out

    out = asyncio.run(consume())
    assert out[0] == 'event: a\ndata: {"type": "a"}\n\n' and out[-1].startswith("event: b\n")
    assert set(out[1:-1]) == {"PING"}  # at least one, and nothing else
    assert cleaned == [True]
