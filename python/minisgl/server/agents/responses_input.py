"""A Responses request's ``input`` as chat messages and its ``text`` as a chat
``response_format`` (``responses_api.py`` builds the chat request from them): message items,
function calls and their outputs, reasoning items, ``input_image`` parts for a vision model;
what the chat path cannot carry is a 400 naming the Responses field."""

from __future__ import annotations

from typing import Any

from minisgl.server.agents.chat_bridge import strip_billing_header
from minisgl.server.agents.images import responses_image
from minisgl.server.agents.responses_tools import chat_name
from minisgl.server.openai.errors import ApiError


def bad(param: str, message: str) -> ApiError:
    """A 400 naming the Responses field."""
    return ApiError(400, f"{param}: {message}", param)



def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(param, "must be a string or a list of content parts")
    return "".join(_part_text(part, f"{param}[{j}]") for j, part in enumerate(content))


def _part_text(part: Any, param: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
        what = "images" if kind == "input_image" else "files" if kind == "input_file" else kind
        raise bad(f"{param}.type", f"{what!s} content parts are not supported (text only)")
    if not isinstance(part.get("text"), str):
        raise bad(f"{param}.text", "must be a string")
    return part["text"]


def _user_content(content: Any, param: str, vision: bool) -> str | list[dict]:
    """A user message's content: its text, or (a vision model, ``input_image`` parts) chat
    parts, each image an ``image_url`` part that remembers its Responses field."""
    images = [j for j, part in enumerate(content) if isinstance(part, dict)
              and part.get("type") == "input_image"] if isinstance(content, list) else []
    if not vision or not images:
        return _text_of(content, param)
    parts: list[dict] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if j not in images:
            parts.append({"type": "text", "text": _part_text(part, where)})
        else:
            parts.append(responses_image(part, where))
    return parts


def input_messages(items: str | list[dict], vision: bool = False) -> list[dict]:
    """The chat messages of ``input``; ``vision``: the model takes ``input_image`` parts (in
    user messages)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    reasoning: str | None = None  # a reasoning item, for the assistant message after it

    def assistant() -> dict:
        nonlocal reasoning
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant" or reasoning is not None:
            last = {"role": "assistant", "content": ""}
            messages.append(last)
        if reasoning is not None:
            last["reasoning_content"], reasoning = reasoning, None
        return last

    for i, item in enumerate(items):
        kind, param = item.get("type", "message"), f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad(f"{param}.role", "must be user, assistant, system or developer")
            if role == "user":
                content = _user_content(item.get("content"), f"{param}.content", vision)
                if isinstance(content, str):
                    content = strip_billing_header(content)
                messages.append({"role": "user", "content": content})
                continue
            text = _text_of(item.get("content"), f"{param}.content")
            if role == "assistant":
                assistant()["content"] += text
            else:
                messages.append({"role": "system" if role == "developer" else role,
                                 "content": strip_billing_header(text)})
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    raise bad(f"{param}.{name}", "must be a string")
            name = chat_name(item.get("namespace"), item["name"])
            assistant().setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": name, "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad(f"{param}.call_id", "must be a string")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text_of(item.get("output"), f"{param}.output")})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = (_text_of(parts, f"{param}.content") if parts
                         else item.get("encrypted_content") or "")
        else:
            raise bad(f"{param}.type", f"input items of type {kind!r} are not supported "
                       "(message, function_call, function_call_output, reasoning)")
    return messages


def chat_format(text: dict | None) -> dict | None:
    """``text.format`` as a chat ``response_format``; ``text.verbosity`` other than medium is
    refused (the model has no verbosity control)."""
    text = text or {}
    for name, value in text.items():
        if name == "verbosity" and value not in (None, "medium"):
            raise bad("text.verbosity", "the verbosity cannot be set")
        if name not in ("format", "verbosity"):
            raise bad(f"text.{name}", "unknown field")
    fmt = text.get("format")
    if fmt is None or fmt.get("type") != "json_schema":
        return fmt
    spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}
