"""OpenAI's Responses API (``/v1/responses``, what Codex CLI speaks), translated onto the chat path.

A request becomes a chat request: ``instructions`` a system message, ``input`` items chat messages
(``function_call`` items an assistant's ``tool_calls``, ``function_call_output`` items tool
messages, ``reasoning`` items the next assistant message's ``reasoning_content``), function
and namespace tools chat tools (``responses_tools.py``: built-in tools are left out),
``text.format`` the chat ``response_format``, ``input_image`` parts (a vision model's) chat
``image_url`` parts (``responses_input.py``). ``previous_response_id`` prepends the stored
conversation. What the chat path cannot do (background mode; images for a model without a
vision tower) is a 400 naming it (``fields.py`` holds the field tables).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from minisgl.server.agents.chat_bridge import (
    AgentStream,
    StreamFailed,
    count_tokens_of,
    reasoning_kwargs,
    start_chat,
    strip_billing_header,
)
from minisgl.server.agents.responses_input import bad, chat_format, input_messages
from minisgl.server.agents.responses_store import ResponseStore, Stored
from minisgl.server.agents.responses_stream import ResponseBuilder, _id
from minisgl.server.agents.responses_tools import ResponsesTools
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.protocol import parse
from minisgl.server.openai.request_context import (
    authorize,
    check_model,
    read_json,
    server_config,
)
from minisgl.utils import init_logger

logger = init_logger(__name__)
router = APIRouter()
# chat field -> Responses field, for the chat path's errors
NAMES = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format",
         "messages": "input", "prompt": "input", "chat_template_kwargs": "reasoning"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ResponsesRequest(_Strict):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    stream: bool | None = None
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None
    stream_options: dict[str, Any] | None = None


async def chat_body(request: Request, req: ResponsesRequest, history: list[dict],
                    tools: ResponsesTools) -> dict:
    instructions = ([{"role": "system", "content": strip_billing_header(req.instructions)}]
                    if req.instructions else [])
    reasoning = req.reasoning or {}
    for name in reasoning:
        if name not in ("effort", "summary", "generate_summary"):
            raise bad(f"reasoning.{name}", "unknown field")
    messages = input_messages(req.input, request.app.state.vision)
    body = {"model": req.model, "messages": instructions + history + messages,
            "tools": tools.chat_tools(), "tool_choice": tools.chat_tool_choice(req.tool_choice),
            "parallel_tool_calls": req.parallel_tool_calls,
            "response_format": chat_format(req.text), "temperature": req.temperature,
            "top_p": req.top_p, "max_completion_tokens": req.max_output_tokens,
            "chat_template_kwargs": await reasoning_kwargs(request, reasoning.get("effort"),
                                                           "reasoning.effort")}
    return {k: v for k, v in body.items() if v is not None}


# ------------------------------------------------------------------------------ endpoints
def _store(request: Request) -> ResponseStore:
    if not hasattr(request.app.state, "responses_store"):
        request.app.state.responses_store = ResponseStore()
    return request.app.state.responses_store


def _echo(req: ResponsesRequest, rid: str, model: str) -> dict:
    """The request fields a response object repeats."""
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {}, "parallel_tool_calls": req.parallel_tool_calls
            is not False, "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning or {"effort": None, "summary": None},
            "store": req.store is not False, "temperature": req.temperature,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "top_p": req.top_p, "truncation": "disabled", "background": False}


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    req = parse(ResponsesRequest, await read_json(request))
    model = check_model(request, req.model)
    store, history = _store(request), []
    if req.previous_response_id is not None:
        previous = store.get(req.previous_response_id)
        if previous is None or previous.run is not None:
            raise ApiError(400, f"previous_response_id: no stored, finished response "
                           f"{req.previous_response_id!r}", "previous_response_id",
                           "previous_response_not_found")
        history = previous.messages
    tools = ResponsesTools.from_request(req.tools, server_config(request).reject_unsupported_tools)
    body = await chat_body(request, req, history, tools)
    include = set(req.include or ())
    if include - {"reasoning.encrypted_content"}:
        raise bad("include", f"{sorted(include)} is not supported (only "
                   "reasoning.encrypted_content)")
    summary = (req.reasoning or {}).get("summary") or (req.reasoning or {}).get("generate_summary")
    rid = _id("resp")
    echo = _echo(req, rid, model)
    if tools.dropped:
        logger.info("%s: tools left out (the server cannot run them): %s", rid,
                    tools.describe_dropped())
        echo["dropped_tools"] = tools.dropped
    builder = ResponseBuilder(echo, bool(summary), "reasoning.encrypted_content" in include,
                              await count_tokens_of(request), tools.namespaces)
    run = await start_chat(request, body, NAMES, rid)
    entry = Stored(builder.response(), run=run)
    if req.store is not False:
        store.put(rid, entry)

    async def events():
        for event in builder.start():
            yield event
        try:
            async for chunk in run.chunks():
                for event in builder.feed(chunk):
                    yield event
            tail = (builder.finish() if run.done
                    else builder.fail("the client disconnected", "client_disconnected"))
        except StreamFailed as e:
            tail = (builder.fail("the response was cancelled", "cancelled", "cancelled")
                    if run.cancelled else builder.fail(str(e)))
        entry.response, entry.run = builder.response(), None
        entry.messages = body["messages"][1 if req.instructions else 0:] + [
            m for m in [builder.history()] if m]
        for event in tail:
            yield event

    if req.stream:
        return AgentStream(events(), run, named=True)
    async for _ in events():
        pass
    if builder.status == "failed":
        raise ApiError(500, builder.error["message"])
    return JSONResponse(builder.response())


def _stored(request: Request, rid: str) -> Stored:
    authorize(request)
    entry = _store(request).get(rid)
    if entry is None:
        raise ApiError(404, f"no stored response {rid!r}", "response_id", "not_found")
    return entry


@router.get("/v1/responses/{rid}")
async def get_response(request: Request, rid: str) -> dict:
    if request.query_params.get("stream") not in (None, "false"):
        raise bad("stream", "replaying a stored response as a stream is not supported")
    return _stored(request, rid).response


@router.post("/v1/responses/{rid}/cancel")
async def cancel_response(request: Request, rid: str) -> dict:
    entry = _stored(request, rid)
    if entry.run is None:
        raise ApiError(400, f"response {rid!r} is {entry.response['status']}; only an "
                       "in-progress response can be cancelled", "response_id")
    entry.run.cancel()
    return {**entry.response, "status": "cancelled"}


@router.delete("/v1/responses/{rid}")
async def delete_response(request: Request, rid: str) -> dict:
    _stored(request, rid)
    _store(request).delete(rid)
    return {"id": rid, "object": "response.deleted", "deleted": True}
