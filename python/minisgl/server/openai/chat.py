"""``/v1/chat/completions``: the chat path, which the agent APIs (``server/agents/``) translate
onto through ``run_chat``.

Every request fans out into one backend request per choice; the handler collects their replies
from the ``FrontendManager``. Streams wait for every choice's first reply before the 200 headers go
out, so that an error the backend finds (a prompt longer than the context) is still a JSON 4xx. A
client that goes away aborts its requests, so its KV cache is freed at once.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minisgl.message import UserReply
from minisgl.server.openai import structured
from minisgl.server.openai.bodies import ChoiceState, chat_logprobs, chunker, response, usage
from minisgl.server.openai.call import respond
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.generation_defaults import apply_defaults
from minisgl.server.openai.images import chat_images, load_images
from minisgl.server.openai.protocol import ChatCompletionRequest, parse
from minisgl.server.openai.reasoning import delta_fields, message_fields
from minisgl.server.openai.request_context import check_model, read_json, start_call, tool_parser
from minisgl.server.openai.tools import ChatTools, tool_delta, tool_message
from minisgl.server.openai.validation import check_limits
from minisgl.tokenizer.harmony import EFFORTS

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await run_chat(request, parse(ChatCompletionRequest, await read_json(request)))


async def run_chat(request: Request, req: ChatCompletionRequest,
                   rid: str | None = None) -> Response:
    """One parsed chat request, whole or streamed; the agent APIs (``agents/``) translate onto
    it, giving the id their clients see (``resp_...``, ``msg_...``) for the request's log line."""
    req = apply_defaults(req, request.app.state.sampling_defaults)
    model = check_model(request, req.model)
    messages, images = chat_images(request, [m.to_dict() for m in req.messages])
    kwargs = req.chat_template_kwargs
    tools = ChatTools.from_request(req.tools, req.tool_choice, req.parallel_tool_calls,
                                   tool_parser(request))
    harmony = request.app.state.harmony  # gpt-oss: harmony renders and parses (harmony.py)
    kwargs = _harmony_checks(req, harmony, tools, kwargs)
    grammar = structured.requested_grammar(req, tools and tools.schema())
    await structured.check(grammar)
    extra = {grammar[0]: grammar[1]} if grammar else None
    cap = request.app.state.config.default_max_tokens
    params = [check_limits(req.params(i, extra, cap)) for i in range(req.n or 1)]
    fields = {"messages": messages, "chat_template_kwargs": kwargs,
              "tools": tools.tools if tools else None,
              "images": await load_images(request, images)}  # fetched once all else is checked
    specs = [(fields, p, 0) for p in params]
    think = (await request.app.state.reasoning.mode(request.app.state.tokens, kwargs)
             if req.separate_reasoning is not False and harmony is None else None)
    text_of = await request.app.state.tokens.get() if req.logprobs else None
    top = req.top_logprobs or 0
    rid, created = rid or f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    call = await start_call(request, specs, rid, messages)
    states = list(call.states.values())
    splitters = {s.uid: think.splitter() if think is not None else None for s in states}
    streams = {s.index: tools.stream() for s in states} if tools else {}
    channels = {s.uid: harmony.stream() for s in states} if harmony else {}

    def lps(entries: list) -> dict | None:
        return chat_logprobs(entries, text_of, top) if text_of else None

    chunk = chunker("chat.completion.chunk", rid, created, model, req.include_usage)

    def piece(s: ChoiceState, r: UserReply) -> dict | None:
        # the reasoning is split off first; tool calls are parsed from the content that is left
        delta = delta_fields(splitters[s.uid], r.text, r.finish_reason is not None)
        reason = r.finish_reason
        if harmony:  # the channels say what is reasoning, answer or tool call
            delta, reason = channels[s.uid].delta(s.token_ids, r.finish_reason)
            if not (delta or reason or r.logprobs):
                return None
        elif tools:
            parsed, reason = tool_delta(streams[s.index], delta.pop("content", ""), r.finish_reason)
            delta.update(parsed)
            if not (delta or reason or r.logprobs):
                return None  # text held back (a tool call's start, not yet its name)
        return chunk([{"index": s.index, "delta": delta, "logprobs": lps(r.logprobs or []),
                       "finish_reason": reason}])

    def message(s: ChoiceState) -> tuple[dict, str | None]:
        if harmony:
            return channels[s.uid].message(s.token_ids, s.finish_reason)
        fields = message_fields("".join(s.text), think)
        if not tools:
            return {"role": "assistant", **fields}, s.finish_reason
        msg, reason = tool_message(streams[s.index], fields.pop("content"), s.finish_reason)
        return {**msg, **fields}, reason

    async def render() -> dict:
        choices = [{"index": s.index, "message": msg, "logprobs": lps(s.logprobs),
                    "finish_reason": reason} for s in states for msg, reason in [message(s)]]
        return response("chat.completion", rid, created, model, choices, usage=usage(states))

    head = [chunk([{"index": s.index, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}]) for s in states]
    tail = lambda: [chunk([], usage=usage(states))] if req.include_usage else []  # noqa: E731
    return await respond(call, bool(req.stream), render, head, piece, tail)


def _harmony_checks(req: ChatCompletionRequest, harmony, tools: ChatTools | None,
                    kwargs: dict | None) -> dict | None:
    """``reasoning_effort`` goes to harmony's system message (other models: a 400; their
    templates take ``chat_template_kwargs``); a forced tool choice, a grammar over the whole
    output, cannot hold harmony's channels."""
    if harmony is None:
        if req.reasoning_effort is not None:
            raise ApiError(400, "reasoning_effort: only harmony models (gpt-oss) take it; give "
                           "this model's template its own chat_template_kwargs", "reasoning_effort")
        return kwargs
    if tools is not None and tools.forced:
        raise ApiError(400, "tool_choice: gpt-oss (harmony) takes 'auto' or 'none'", "tool_choice")
    if req.reasoning_effort is None:
        return kwargs
    if req.reasoning_effort not in EFFORTS:
        raise ApiError(400, f"reasoning_effort: must be one of {', '.join(EFFORTS)}",
                       "reasoning_effort")
    return {**(kwargs or {}), "reasoning_effort": req.reasoning_effort}
