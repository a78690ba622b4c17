"""Tools in chat requests: validation, ``tool_choice``, the schema that forces a call, and the
per-choice streams that turn a model's output into ``tool_calls``.

``tool_choice`` ``required`` or a named function constrains the output to JSON calls (a grammar
from the functions' parameter schemas), parsed by the ``json`` parser; ``auto`` lets the model
answer in its own format (the model's parser); ``none`` leaves the tools out of the prompt.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from typing import Any

from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.tool_parsers import TOOL_PARSERS, ToolCallStream, detect_parser

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def _function(tool: Any, i: int) -> dict:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise _bad(f"{param}.type", "only tools of type 'function' are supported")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise _bad(f"{param}.function", "must be an object")
    if not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
        raise _bad(f"{param}.function.name", "must be 1-64 letters, digits, '_' or '-'")
    if not isinstance(fn.get("description", ""), (str, type(None))):
        raise _bad(f"{param}.function.description", "must be a string")
    if not isinstance(fn.get("parameters", {}), dict):
        raise _bad(f"{param}.function.parameters", "must be a JSON schema object")
    if not isinstance(fn.get("strict", False), (bool, type(None))):
        raise _bad(f"{param}.function.strict", "must be a boolean")
    return fn


class ChatTools:
    """The tools of one chat request, after validation."""

    def __init__(self, tools: list[dict], choice: str, parser: str, parallel: bool) -> None:
        self.tools, self.choice, self.parallel = tools, choice, parallel
        self.parser = "json" if self.forced else parser

    @classmethod
    def from_request(cls, tools: Any, tool_choice: Any, parallel: Any,
                     parser: str) -> ChatTools | None:
        """None when there are no tools or ``tool_choice`` is ``none``."""
        if tools is None:
            if tool_choice not in (None, "none"):
                raise _bad("tool_choice", "requires tools")
            return None
        if not isinstance(tools, list) or not tools:
            raise _bad("tools", "must be a non-empty list of tools")
        functions = [_function(t, i) for i, t in enumerate(tools)]
        names = [f["name"] for f in functions]
        if len(set(names)) != len(names):
            raise _bad("tools", "function names must be unique")
        if not isinstance(parallel, (bool, type(None))):
            raise _bad("parallel_tool_calls", "must be a boolean")
        choice = cls._choice(tool_choice, names)
        if choice == "none":
            return None
        return cls(tools, choice, parser, parallel is not False)

    @staticmethod
    def _choice(value: Any, names: list[str]) -> str:
        if value is None:
            return "auto"
        if value in ("none", "auto", "required"):
            return value
        fn = value.get("function") if isinstance(value, dict) else None
        if not (isinstance(value, dict) and value.get("type") == "function"
                and isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise _bad("tool_choice", "must be 'none', 'auto', 'required' or "
                       "{'type': 'function', 'function': {'name': ...}}")
        if fn["name"] not in names:
            raise _bad("tool_choice.function.name", f"no tool is named {fn['name']!r}")
        return fn["name"]

    @property
    def forced(self) -> bool:
        return self.choice not in ("auto", "none")

    def schema(self) -> str | None:
        """JSON schema of the output when a call is forced: one named call, or a list of calls."""
        if not self.forced:
            return None
        calls = {}
        for tool in self.tools:
            fn = tool["function"]
            calls[fn["name"]] = {
                "type": "object",
                "properties": {"name": {"const": fn["name"]},
                               "arguments": fn.get("parameters") or {"type": "object",
                                                                     "properties": {}}},
                "required": ["name", "arguments"], "additionalProperties": False,
            }
        if self.choice != "required":
            return json.dumps(calls[self.choice])
        array = {"type": "array", "minItems": 1, "items": {"anyOf": list(calls.values())}}
        if not self.parallel:
            array["maxItems"] = 1
        return json.dumps(array)

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self.parser)


def _finish_reason(stream: ToolCallStream, reason: str | None) -> str | None:
    return "tool_calls" if reason == "stop" and stream.called else reason


def tool_delta(stream: ToolCallStream, text: str, reason: str | None) -> tuple[dict, str | None]:
    """A streamed choice's delta (content and/or tool-call deltas) and finish reason."""
    content, calls = stream.feed(text, final=reason is not None)
    delta = {**({"content": content} if content else {}),
             **({"tool_calls": calls} if calls else {})}
    return delta, _finish_reason(stream, reason)


def tool_message(stream: ToolCallStream, text: str, reason: str | None) -> tuple[dict, str | None]:
    """A whole choice's message (content is null when only tools were called) and finish reason."""
    content, _ = stream.feed(text, final=True)
    calls = stream.tool_calls()
    message = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message, _finish_reason(stream, reason)


def check_parser(name: str) -> str:
    if name != "auto" and name not in TOOL_PARSERS:
        raise ValueError(f"tool_call_parser: {name!r} is not one of auto, "
                         f"{', '.join(TOOL_PARSERS)}")
    return name


@lru_cache(maxsize=8)
def model_parser(model_path: str | None, flag: str = "auto") -> str:
    """``--tool-call-parser``, or the format the model's chat template teaches."""
    return flag if flag != "auto" else detect_parser(_chat_template(model_path))


def _chat_template(model_path: str | None) -> str | None:
    if not model_path or not os.path.isdir(model_path):
        return None
    jinja = os.path.join(model_path, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja) as f:
            return f.read()
    try:
        with open(os.path.join(model_path, "tokenizer_config.json")) as f:
            template = json.load(f).get("chat_template")
    except (OSError, ValueError):
        return None
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = " ".join(t.get("template", "") for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else None
