"""Anthropic's Messages API (``/v1/messages``, what Claude Code and the Claude Agent SDK speak),
translated onto the chat path, and ``/v1/messages/count_tokens``.

``system`` becomes a system message (Claude Code's per-request billing header stripped:
``chat_bridge.strip_billing_header``), content blocks chat messages (``tool_use`` an assistant's
``tool_calls``, ``tool_result`` tool messages, ``thinking`` ``reasoning_content``, ``image``
blocks of a vision model chat ``image_url`` parts: ``images.py``), tools chat function tools,
``tool_choice`` auto/any/tool/none the chat ``tool_choice``. Every error answers Anthropic's
``{"type": "error", "error": {...}}`` body.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from minisgl.server.agents.anthropic_stream import MessageBuilder, message_id
from minisgl.server.agents.chat_bridge import (
    AgentStream,
    StreamFailed,
    count_chat_tokens,
    matched_stop,
    reasoning_kwargs,
    start_chat,
    strip_billing_header,
)
from minisgl.server.agents.images import anthropic_image
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.protocol import parse
from minisgl.server.openai.request_context import check_model, read_json

router = APIRouter()
NAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences",
         "response_format": "output_config.format", "prompt": "messages"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}
PING = 'event: ping\ndata: {"type": "ping"}\n\n'
_TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control", "strict"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class CountTokensRequest(_Strict):
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    stream: bool | None = None


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


# the scheduler's context errors (scheduler/validation.py), worded
# for Anthropic clients: Claude Code parses the first to retry with a smaller max_tokens and
# compacts its conversation on the second
_OVER_CONTEXT = re.compile(r"maximum context length is (\d+) tokens. However, you requested \d+ "
                           r"tokens \((\d+) in the prompt, (\d+) in the completion\)")
_PROMPT_TOO_LONG = re.compile(r"^\w+: (\d+) tokens is too long; the maximum context length is "
                              r"(\d+) tokens")


def anthropic_message(message: str) -> str:
    """``message`` in Anthropic's wording where Anthropic clients act on it."""
    if m := _OVER_CONTEXT.search(message):
        limit, prompt, completion = m.groups()
        return (f"input length and `max_tokens` exceed context limit: {prompt} + {completion} > "
                f"{limit}, decrease input length or `max_tokens` and try again")
    if m := _PROMPT_TOO_LONG.search(message):
        return f"prompt is too long: {m[1]} tokens > {m[2]} maximum"
    return message


def error_response(e: ApiError) -> JSONResponse:
    kind = ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    message = anthropic_message(e.message)
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}},
                        e.status, headers={"Retry-After": "1"} if e.status == 503 else None)


# ------------------------------------------------------------------------------ translation
def _text(block: dict, param: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _bad(f"{param}.text", "must be a string")
    return block["text"]


def _blocks(content: Any, param: str, vision: bool = False) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(param, "must be a string or a list of content blocks")
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "image" and vision:
            continue
        if kind in ("image", "document"):
            raise _bad(f"{param}[{j}].type", f"{kind} blocks are not supported (text only)")
        if kind not in ("text", "tool_use", "tool_result", "thinking"):
            raise _bad(f"{param}[{j}].type", f"content blocks of type {kind!r} are not "
                       "supported (text, tool_use, tool_result, thinking)")
    return content


def _tool_result(block: dict, param: str) -> dict:
    content = block.get("content", "")
    text = content if isinstance(content, str) else "".join(
        _text(b, f"{param}.content[{k}]") for k, b in enumerate(_blocks(content, param)))
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}


def chat_messages(req: CountTokensRequest, vision: bool = False) -> list[dict]:
    """The chat messages of ``system`` and ``messages``; ``vision``: the model takes image
    blocks (in user messages)."""
    system = req.system
    if isinstance(system, list):
        system = "\n".join(strip_billing_header(_text(b, f"system[{i}]"))
                           for i, b in enumerate(system) if b.get("type") == "text")
    out = [{"role": "system", "content": strip_billing_header(system)}] if system else []
    for i, message in enumerate(req.messages):
        role, param = message.get("role"), f"messages[{i}].content"
        if role not in ("user", "assistant", "system"):
            raise _bad(f"messages[{i}].role", "must be user or assistant")
        chat: dict = {"role": role, "content": ""}
        final_assistant = role == "assistant" and i == len(req.messages) - 1
        if message.get("content") == [] and not final_assistant:
            raise _bad(param, "must not be empty: all messages must have non-empty content "
                       "except for the optional final assistant message")
        parts: list[dict] = []  # text and image parts, when the message has an image
        for j, block in enumerate(_blocks(message.get("content"), param, vision)):
            kind, where = block["type"], f"{param}[{j}]"
            if kind == "text":
                chat["content"] += _text(block, where)
                parts.append({"type": "text", "text": _text(block, where)})
            elif kind == "image" and role == "user":
                parts.append(anthropic_image(block, where))
            elif kind == "tool_result" and role == "user":
                out.append(_tool_result(block, where))
            elif kind == "tool_use" and role == "assistant":
                chat.setdefault("tool_calls", []).append(
                    {"id": block.get("id"), "type": "function",
                     "function": {"name": block.get("name"),
                                  "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "thinking" and role == "assistant":
                chat["reasoning_content"] = block.get("thinking") or ""
            else:
                raise _bad(f"{where}.type", f"a {kind} block cannot be in a {role} message")
        if any(p["type"] == "image_url" for p in parts):
            chat["content"] = parts
        if chat["content"] or len(chat) > 2 or (role == "assistant"):
            out.append(chat)
    return out


def chat_tools(req: CountTokensRequest) -> dict:
    out: dict[str, Any] = {}
    if req.tools:
        tools = []
        for i, tool in enumerate(req.tools):
            if tool.get("type") not in (None, "custom"):
                raise _bad(f"tools[{i}].type", f"server tools ({tool['type']!r}) are not "
                           "supported (client tools with an input_schema only)")
            for name in tool:
                if name not in _TOOL_KEYS:
                    raise _bad(f"tools[{i}].{name}", "unknown field")
            fn = {"name": tool.get("name"), "description": tool.get("description", ""),
                  "parameters": tool.get("input_schema")}
            tools.append({"type": "function", "function": fn})
        out["tools"] = tools
    choice = req.tool_choice
    if choice is not None:
        kind = choice.get("type")
        mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            mapped = {"type": "function", "function": {"name": choice.get("name")}}
        if mapped is None:
            raise _bad("tool_choice.type", "must be auto, any, tool or none")
        out["tool_choice"] = mapped
        if choice.get("disable_parallel_tool_use") and req.tools:
            out["parallel_tool_calls"] = False
    return out


async def chat_body(request: Request, req: CountTokensRequest) -> dict:
    effort = None
    thinking = req.thinking or {}
    if thinking:
        kind = thinking.get("type")
        if kind not in ("enabled", "adaptive", "disabled"):
            raise _bad("thinking.type", "must be enabled, adaptive or disabled")
        effort = "none" if kind == "disabled" else "medium"
    config = dict(req.output_config or {})
    effort = config.pop("effort", None) or effort
    messages = chat_messages(req, request.app.state.vision)
    body: dict[str, Any] = {"model": req.model, "messages": messages, **chat_tools(req)}
    if (fmt := config.pop("format", None)) is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise _bad("output_config.format.type", "must be json_schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": fmt.get("schema") or {"type": "object"}}}
    if config:
        raise _bad(f"output_config.{next(iter(config))}", "unknown field")
    edits = (req.context_management or {}).get("edits") or []
    if any(e.get("type") != "clear_thinking_20251015" or e.get("keep") != "all" for e in edits):
        raise _bad("context_management.edits", "only clearing no thinking "
                   "({'type': 'clear_thinking_20251015', 'keep': 'all'}) is supported")
    kwargs = await reasoning_kwargs(request, effort and effort.replace("max", "high"),
                                    "output_config.effort")
    return {**body, **({"chat_template_kwargs": kwargs} if kwargs else {})}


# ------------------------------------------------------------------------------ endpoints
async def _messages(request: Request) -> Response:
    req = parse(MessagesRequest, await read_json(request))
    model = check_model(request, req.model)
    body = await chat_body(request, req)
    sampling = {"max_completion_tokens": req.max_tokens, "stop": req.stop_sequences,
                "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
    body.update({k: v for k, v in sampling.items() if v is not None})
    mid = message_id()
    run = await start_chat(request, body, NAMES, mid)
    state = run.state
    builder = MessageBuilder(model, state.prompt_tokens if state else 0,
                             state.cached_tokens if state else 0, mid)

    async def events():
        for event in builder.start():
            yield event
        try:
            async for chunk in run.chunks():
                for event in builder.feed(chunk):
                    yield event
        except StreamFailed as e:
            yield {"type": "error", "error": {"type": "api_error", "message": str(e)}}
            return
        text = "".join(b["text"] for b in builder.blocks if b["type"] == "text")
        stop = await matched_stop(request, run, text, req.stop_sequences or [])
        for event in builder.finish(stop):
            yield event

    if req.stream:
        return AgentStream(events(), run, keepalive=PING)
    async for event in events():
        if event["type"] == "error":
            raise ApiError(500, event["error"]["message"])
    return JSONResponse(builder.message)


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    try:
        return await _messages(request)
    except ApiError as e:
        return error_response(e)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as the chat template renders it (the same text generation sees),
    each image as the tokens its size expands to."""
    try:
        req = parse(CountTokensRequest, await read_json(request))
        check_model(request, req.model)
        body = await chat_body(request, req)
        return JSONResponse({"input_tokens": await count_chat_tokens(request, body, NAMES)})
    except ApiError as e:
        return error_response(e)
