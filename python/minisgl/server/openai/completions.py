"""``/v1/completions``: text in, text out, with ``echo`` of the prompt and its log-probs."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minisgl.message import UserReply
from minisgl.server.openai import structured
from minisgl.server.openai.bodies import (
    ChoiceState,
    chunker,
    completion_logprobs,
    response,
    usage,
)
from minisgl.server.openai.call import respond
from minisgl.server.openai.echo import Echo, join_logprobs, prompt_text
from minisgl.server.openai.generation_defaults import apply_defaults
from minisgl.server.openai.protocol import CompletionRequest, parse
from minisgl.server.openai.request_context import check_model, read_json, start_call
from minisgl.server.openai.validation import check_limits

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    req = apply_defaults(parse(CompletionRequest, await read_json(request)),
                         request.app.state.sampling_defaults)
    model = check_model(request, req.model)
    n = req.n or 1
    grammar = structured.requested_grammar(req)
    await structured.check(grammar)
    params = [check_limits(req.params(i, {grammar[0]: grammar[1]} if grammar else None))
              for i in range(n)]
    specs = [({"text": p} if isinstance(p, str) else {"input_ids": p}, params[i], k)
             for k, p in enumerate(req.prompt) for i in range(n)]
    tokens = request.app.state.tokens
    text_of = await tokens.get() if req.logprobs is not None or req.echo else None
    echo = None
    if req.echo:
        echo = Echo([prompt_text(p, tokens.tokenizer, text_of) for p in req.prompt],
                    text_of, req.logprobs)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    call = await start_call(request, specs, rid, req.prompt)
    states = list(call.states.values())

    def lps(s: ChoiceState, entries: list) -> dict | None:
        return completion_logprobs(entries, text_of, req.logprobs, s) \
            if req.logprobs is not None else None

    def output(s: ChoiceState, text: str, entries: list) -> tuple[str, dict | None]:
        """The choice's new text and log-probs, after the echoed prompt the first time."""
        head, head_lps = echo.prefix(s) if echo is not None else ("", None)
        return head + text, join_logprobs(head_lps, lps(s, entries))

    chunk = chunker("text_completion", rid, created, model, req.include_usage)

    def piece(s: ChoiceState, r: UserReply) -> dict:
        text, logprobs = output(s, r.text, r.logprobs or [])
        return chunk([{"index": s.index, "text": text, "logprobs": logprobs,
                       "finish_reason": r.finish_reason}])

    async def render() -> dict:
        choices = [{"index": s.index, "finish_reason": s.finish_reason}
                   | dict(zip(("text", "logprobs"), output(s, "".join(s.text), s.logprobs)))
                   for s in states]
        return response("text_completion", rid, created, model, choices, usage=usage(states))

    tail = lambda: [chunk([], usage=usage(states))] if req.include_usage else []  # noqa: E731
    return await respond(call, bool(req.stream), render, [], piece, tail)
