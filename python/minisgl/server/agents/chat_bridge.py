"""The agent APIs' one way to generate: a translated request runs as a streamed chat completion
through the handler of ``/v1/chat/completions`` (``openai/chat.py``'s ``run_chat``), so the chat
template, tool and reasoning parsers, grammars, limits and metrics are the chat path's own. Each
API module builds the chat body, reads the chat chunks back as dicts, and renders them in its own
shape, whole or as its own stream events.

Errors the chat path raises name the chat field; ``rename`` puts the agent API's name back.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from starlette.responses import StreamingResponse

from minisgl.message import TokenizeMsg, UserReply
from minisgl.params import SamplingParams
from minisgl.server.agents.images import image_names
from minisgl.server.openai.bodies import ChoiceState
from minisgl.server.openai.chat import run_chat
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.images import chat_images, load_images
from minisgl.server.openai.protocol import ChatCompletionRequest, parse

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")

# Claude Code's first system block, "x-anthropic-billing-header: cc_version=2.1.x.abc;
# cc_entrypoint=cli; cch=1f2e3;", changes on every request (a per-request hash); at the start of
# the prompt it would make every request miss the prefix cache. It means nothing to the model.
_BILLING = re.compile(r"^x-anthropic-billing-header:[^\n]*(\n|$)", re.MULTILINE)


def strip_billing_header(text: str) -> str:
    """``text`` without Claude Code's per-request billing-header lines (docs/features.md)."""
    return _BILLING.sub("", text) if "x-anthropic-billing-header:" in text else text


class StreamFailed(Exception):
    """The chat stream ended with an error event after its 200 went out."""

    def __init__(self, body: dict) -> None:
        err = body.get("error") or {}
        super().__init__(err.get("message") or "the request failed")
        self.kind = err.get("type") or "server_error"


def rename(e: ApiError, names: dict[str, str]) -> ApiError:
    """The chat path's error with the agent API's field names (``max_tokens`` -> ...): the
    longest name that is the error's field or a dotted prefix of it."""
    if e.param is None:
        return e
    found = [k for k in names if e.param == k or e.param.startswith(k + ".")]
    if not found:
        return e
    key = max(found, key=len)
    param = names[key] + e.param[len(key):]
    message = e.message.replace(e.param, param, 1) if e.message.startswith(e.param) else e.message
    return ApiError(e.status, message, param, e.code)


class ChatRun:
    """One chat completion, streamed: ``chunks()`` yields the chat chunks (usage in the last);
    ``close()`` aborts what still runs (idempotent; ``chunks`` closes it when it ends).
    ``done``: the chat stream ended normally; ``cancelled``: ``cancel()`` stopped it."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.call = getattr(response, "call", None)  # None: the client left before the start
        self.done = self.cancelled = False

    async def chunks(self) -> AsyncIterator[dict]:
        if self.call is None:
            return
        try:
            async for event in self.response.body_iterator:
                data = event.removeprefix("data: ").strip()
                if data == "[DONE]":
                    self.done = True
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise StreamFailed(chunk)
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if self.call is not None:
            self.call.close()

    def cancel(self) -> None:
        """Stop the generation; the stream that reads it ends with ``StreamFailed``."""
        if self.call is None or self.call.closed:
            return
        self.cancelled = True
        self.close()
        for uid in self.call.states:  # wakes the reader: an aborted reply ends the stream
            self.call.queue.put_nowait(UserReply(uid=uid, finish_reason="abort"))

    @property
    def state(self) -> ChoiceState | None:
        states = list(self.call.states.values()) if self.call is not None else []
        return states[0] if states else None


class AgentStream(StreamingResponse):
    """An agent API's SSE stream of event dicts (``named``: with ``event:`` lines, as the
    Responses and Messages APIs send them); its chat run is closed however it ends.

    After ``KEEPALIVE_S`` without an event it sends ``keepalive`` (Anthropic's ``ping`` event, an
    SSE comment for the Responses API), as Anthropic's API does: text held back by the tool-call
    parser or a slow prefill must not look like a dead connection to the client's idle watchdog."""

    KEEPALIVE_S = 15.0

    def __init__(self, events: AsyncIterator[dict], run: ChatRun, named: bool = True,
                 keepalive: str = ": keep-alive\n\n") -> None:
        super().__init__(self._encode(events, named, keepalive), media_type="text/event-stream")
        self.run = run

    @classmethod
    async def _encode(cls, events: AsyncIterator[dict], named: bool,
                      keepalive: str) -> AsyncIterator[str]:
        it = aiter(events)
        pending: asyncio.Future | None = None
        try:
            while True:
                pending = pending or asyncio.ensure_future(anext(it))
                done, _ = await asyncio.wait({pending}, timeout=cls.KEEPALIVE_S)
                if not done:
                    yield keepalive
                    continue
                try:
                    event = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                name = f"event: {event['type']}\n" if named else ""
                yield f"{name}data: {json.dumps(event, ensure_ascii=False)}\n\n"
        finally:
            if pending is not None:
                pending.cancel()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.close()


async def start_chat(request: Request, body: dict, names: dict[str, str], rid: str) -> ChatRun:
    """Validate ``body`` as a chat request and start it, streamed with usage, logged as ``rid``
    (the agent API's own id); errors before the stream starts (a prompt longer than the context)
    are raised as ``ApiError`` with ``names`` applied."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    names = {**names, **image_names(body.get("messages") or [])}
    try:
        return ChatRun(await run_chat(request, parse(ChatCompletionRequest, body), rid))
    except ApiError as e:
        raise rename(e, names) from None


async def count_chat_tokens(request: Request, body: dict, names: dict[str, str]) -> int:
    """The prompt tokens ``body`` (a translated chat) would take, its images expanded as the chat
    path expands them, so the count equals that request's usage; errors carry ``names``."""
    names = {**names, **image_names(body["messages"])}
    try:
        messages, refs = chat_images(request, body["messages"])
        msg = TokenizeMsg(uid=0, sampling_params=SamplingParams(), messages=messages,
                          tools=body.get("tools") if body.get("tool_choice") != "none" else None,
                          chat_template_kwargs=body.get("chat_template_kwargs"),
                          images=await load_images(request, refs))
        return await request.app.state.prompt_counter.count(request, msg)
    except ApiError as e:
        raise rename(e, names) from None


async def matched_stop(request: Request, run: ChatRun, text: str, stops: list[str]) -> str | None:
    """Which of ``stops`` ended the output (the detokenizer cuts it off the text), or None when
    an end-of-sequence token did: the stop string follows the text in the decoded tokens."""
    if not stops:
        return None
    await request.app.state.tokens.get()
    tokenizer = request.app.state.tokens.tokenizer
    if tokenizer is None:
        return None
    full = tokenizer.decode(run.state.token_ids if run.state else [], skip_special_tokens=True)
    tail = full[max(0, len(text) - 1):]
    found = [(tail.find(s), s) for s in stops if s in tail]
    return min(found)[1] if found else None


async def reasoning_kwargs(request: Request, effort: str | None, param: str) -> dict | None:
    """``chat_template_kwargs`` for a reasoning effort (``none``/``minimal``/``low``/``medium``/
    ``high``; Anthropic's ``thinking`` arrives as ``none`` or ``medium``): given as it is to a
    template that reads ``reasoning_effort``, as ``enable_thinking`` (off for none/minimal) to one
    that reads that; a template with neither (a model that does not reason) takes no kwargs."""
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise ApiError(400, f"{param}: must be one of {', '.join(EFFORTS)}", param)
    await request.app.state.tokens.get()
    template = getattr(request.app.state.tokens.tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    if "reasoning_effort" in template:
        return {"reasoning_effort": effort}
    if "enable_thinking" in template:
        return {"enable_thinking": effort not in ("none", "minimal")}
    return None


async def count_tokens_of(request: Request) -> Callable[[str], int]:
    """Tokens of a text (0 without a tokenizer)."""
    await request.app.state.tokens.get()
    tokenizer = request.app.state.tokens.tokenizer
    if tokenizer is None:
        return lambda text: 0
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False)) if text else 0
