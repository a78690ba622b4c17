"""Chat chunks -> an Anthropic message and its stream events.

As for the Responses API, one builder serves both answers: chat deltas open, extend and close
content blocks (``thinking``, ``text``, ``tool_use``), each change also an event
(``content_block_start``/``_delta``/``_stop``); the whole message is the builder's state at the end.

Usage follows Anthropic's split of the prompt: ``input_tokens`` are the tokens computed for this
request, ``cache_read_input_tokens`` the ones reused from the prefix cache (their sum is the
prompt); nothing is ever written to a cache on request, so ``cache_creation_input_tokens`` is 0.
"""

from __future__ import annotations

import json
import uuid
from copy import deepcopy

# chat finish_reason -> Anthropic stop_reason ("stop" is end_turn or stop_sequence: see finish)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def usage_fields(prompt: int, cached: int, output: int) -> dict:
    return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": output}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


class MessageBuilder:
    def __init__(self, model: str, prompt_tokens: int = 0, cached_tokens: int = 0,
                 mid: str | None = None) -> None:
        self.message = {"id": mid or message_id(), "type": "message", "role": "assistant",
                        "model": model, "content": [], "stop_reason": None,
                        "stop_sequence": None,
                        "usage": usage_fields(prompt_tokens, cached_tokens, 0)}
        self.blocks: list[dict] = self.message["content"]
        self.calls: dict[int, dict] = {}  # chat tool-call index -> its tool_use block
        self.args: dict[int, str] = {}  # block index -> its arguments text so far
        self.open: int | None = None
        self.finish_reason: str | None = None

    def start(self) -> list[dict]:
        return [{"type": "message_start", "message": deepcopy(self.message)}, {"type": "ping"}]

    def feed(self, chunk: dict) -> list[dict]:
        out: list[dict] = []
        if chunk.get("usage"):
            u = chunk["usage"]
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            self.message["usage"] = usage_fields(u.get("prompt_tokens", 0), cached,
                                                 u.get("completion_tokens", 0))
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._append("thinking", delta["reasoning_content"])
            if delta.get("content"):
                out += self._append("text", delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return out

    def _opening(self, block: dict) -> list[dict]:
        out = self._close()
        self.blocks.append(block)
        self.open = len(self.blocks) - 1
        return out + [{"type": "content_block_start", "index": self.open,
                       "content_block": deepcopy(block)}]

    def _append(self, kind: str, text: str) -> list[dict]:
        out: list[dict] = []
        if self.open is None or self.blocks[self.open]["type"] != kind:
            block = ({"type": "text", "text": ""} if kind == "text"
                     else {"type": "thinking", "thinking": "", "signature": ""})
            out += self._opening(block)
        self.blocks[self.open][kind] += text
        delta = ({"type": "text_delta", "text": text} if kind == "text"
                 else {"type": "thinking_delta", "thinking": text})
        return out + [{"type": "content_block_delta", "index": self.open, "delta": delta}]

    def _call(self, delta: dict) -> list[dict]:
        out: list[dict] = []
        fn = delta.get("function") or {}
        index = delta.get("index", 0)
        if index not in self.calls:
            block = {"type": "tool_use", "id": _tool_id(delta.get("id")),
                     "name": fn.get("name") or "", "input": {}}
            out += self._opening(block)
            self.calls[index] = block
            self.args[self.open] = ""
        at = self.blocks.index(self.calls[index])
        if fn.get("arguments"):
            self.args[at] += fn["arguments"]
            out.append({"type": "content_block_delta", "index": at,
                        "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
        return out

    def _close(self) -> list[dict]:
        at, self.open = self.open, None
        if at is None:
            return []
        if at in self.args:
            self.blocks[at]["input"] = _input(self.args[at])
        return [{"type": "content_block_stop", "index": at}]

    def finish(self, stop_sequence: str | None = None) -> list[dict]:
        """Close the message; ``stop_sequence``: the stop sequence that ended it, if one did."""
        out = self._close()
        reason = STOP_REASONS.get(self.finish_reason or "stop", "end_turn")
        if stop_sequence is not None and reason == "end_turn":
            reason = "stop_sequence"
        self.message.update(stop_reason=reason, stop_sequence=stop_sequence)
        usage = self.message["usage"]
        return out + [{"type": "message_delta",
                       "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
                       "usage": dict(usage)}, {"type": "message_stop"}]


def _tool_id(chat_id: str | None) -> str:
    return "toolu_" + (chat_id.removeprefix("call_") if chat_id else uuid.uuid4().hex[:24])


def _input(arguments: str) -> dict:
    """A call's arguments text as the object ``tool_use.input`` holds (an object that is not
    valid JSON, which only an unconstrained model writes, is kept as its text)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"_value": value}
