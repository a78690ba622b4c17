"""One HTTP request's view of the pipeline: a ``Call`` holds its choices (one backend request
each), their replies and its client's disconnect; ``respond`` turns it into a JSON body or an SSE
stream, and whatever way the request ends, its backend requests are aborted or released."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from starlette.responses import JSONResponse, Response, StreamingResponse

from minisgl.message import TokenizeMsg, UserReply
from minisgl.server.openai.bodies import ChoiceState, sse
from minisgl.server.openai.errors import ApiError, error_body
from minisgl.server.openai.request_log import log_request
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.server.openai.frontend import FrontendManager
    from minisgl.server.openai.metrics import ServerMetrics

logger = init_logger(__name__)
POLL_S = 0.5  # how often a waiting handler checks that its client is still there


def merge_replies(a: UserReply, b: UserReply) -> UserReply:
    """One choice's consecutive replies ``a`` then ``b`` as one reply."""
    logprobs = (a.logprobs or []) + (b.logprobs or []) if a.logprobs or b.logprobs else None
    return UserReply(
        uid=a.uid, text=a.text + b.text, token_ids=a.token_ids + b.token_ids, logprobs=logprobs,
        finish_reason=b.finish_reason, prompt_tokens=a.prompt_tokens or b.prompt_tokens,
        cached_tokens=a.cached_tokens or b.cached_tokens,
        first_forward_time=a.first_forward_time or b.first_forward_time,
        prompt_logprobs=a.prompt_logprobs or b.prompt_logprobs,
    )


class ClientGone(Exception):
    """The HTTP client went away while its request ran."""


class Call:
    """The backend requests (one per choice) of one HTTP request and what they produced.

    With ``metrics``, the call is recorded once, when it closes; ``arrival`` (Unix time) is when
    the HTTP request reached the server, the start of its latencies."""

    def __init__(self, frontend: FrontendManager, is_disconnected: Callable[[], Awaitable[bool]],
                 states: list[ChoiceState], metrics: ServerMetrics | None = None,
                 arrival: float | None = None, rid: str | None = None,
                 prompt: Any = None) -> None:
        self.frontend, self.is_disconnected = frontend, is_disconnected
        self.rid, self.prompt, self.closed = rid, prompt, False
        self.states = {s.uid: s for s in states}
        self._checked = time.monotonic()
        self.metrics, self.arrival = metrics, arrival if arrival is not None else time.time()
        self.failed = False  # an error reply ended it (counted by its status, not as an abort)
        self.error: ApiError | None = None  # what the client was answered, for the log line
        self._held: UserReply | None = None  # taken from the queue, not merged: the next reply

    async def start(self, msgs: list[TokenizeMsg]) -> Call:
        try:
            self.queue = await self.frontend.submit(msgs)
        except BaseException as e:
            self.failed = True
            self.error = e if isinstance(e, ApiError) else None
            self.close()
            raise
        return self

    @property
    def done(self) -> bool:
        return all(s.finish_reason for s in self.states.values())

    @property
    def started(self) -> bool:
        return all(s.started for s in self.states.values())

    async def next(self) -> tuple[ChoiceState, UserReply]:
        """The next reply; raises ``ApiError`` for an error reply, ``ClientGone`` on disconnect
        (checked every ``POLL_S``, also while replies keep coming)."""
        while True:
            if time.monotonic() - self._checked >= POLL_S:
                self._checked = time.monotonic()
                if await self.is_disconnected():
                    raise ClientGone
            if (reply := self._queued()) is not None:
                break
            try:
                reply = await asyncio.wait_for(self.queue.get(), POLL_S)
                break
            except asyncio.TimeoutError:
                pass
        if reply.error is not None:
            self.failed = True
            status = reply.status if reply.status >= 400 else 500
            self.error = ApiError(status, reply.error, reply.error_param)
            raise self.error
        if reply.finish_reason == "abort":
            self.failed = True
            self.error = ApiError(503, "the server aborted the request", code="aborted")
            raise self.error
        reply = self._merge_queued(reply)
        state = self.states[reply.uid]
        state.add(reply)
        return state, reply

    def _queued(self) -> UserReply | None:
        if self._held is not None:
            reply, self._held = self._held, None
            return reply
        return None if self.queue.empty() else self.queue.get_nowait()

    def _merge_queued(self, reply: UserReply) -> UserReply:
        """``reply`` and the replies of its choice already queued behind it, as one. A stream that
        fell behind the engine (the event loop busy with many streams) catches up with one event
        instead of one per token, as vLLM merges the outputs a slow consumer left pending."""
        while reply.finish_reason is None:
            after = self._queued()
            if after is None:
                break
            if after.uid != reply.uid or after.error is not None or after.finish_reason == "abort":
                self._held = after
                break
            reply = merge_replies(reply, after)
        return reply

    async def replies(self, buffered: list) -> AsyncIterator[tuple[ChoiceState, UserReply]]:
        for item in buffered:
            yield item
        while not self.done:
            yield await self.next()

    def close(self) -> None:
        """Abort what still runs and forget every queue (idempotent; never awaits); the first
        close records the request (metrics, its log line)."""
        self.frontend.abort_nowait(list(self.states))
        if self.closed:
            return
        self.closed = True
        if self.metrics is not None:
            self.metrics.finish(self.states.values(), self.arrival, self.failed)
        rid = self.rid or str(next(iter(self.states)))
        log_request(rid, self.states.values(), self.arrival, self.failed, self.prompt, self.error)


class _CallStream(StreamingResponse):
    """A stream that always closes its call, even when it is cancelled before it starts."""

    def __init__(self, content: AsyncIterator[str], call: Call) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.call = call

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.call.close()


async def respond(call: Call, stream: bool, render: Callable[[], Any], head: list[dict],
                  piece: Callable[[ChoiceState, UserReply], dict | None],
                  tail: Callable[[], list[dict]]) -> Response:
    """Collect a started call into ``render()``'s JSON, or stream it as SSE: ``head`` events, one
    ``piece`` per reply with news, ``tail`` events, ``[DONE]``. A stream starts once the scheduler
    has taken every choice (``RequestsAcceptedMsg``), so that its refusal (a prompt too long for
    the context) is still an HTTP error while a long prefill or queue wait sends the 200 at once."""
    buffered: list[tuple[ChoiceState, UserReply]] = []
    try:
        while not (call.done if not stream else call.started):
            buffered.append(await call.next())
    except ClientGone:
        call.close()
        return Response(status_code=499)
    except BaseException:
        call.close()
        raise
    if not stream:
        call.close()
        return JSONResponse(await render())
    return _CallStream(_events(call, buffered, head, piece, tail), call)


async def _events(call: Call, buffered: list, head: list[dict], piece, tail) -> AsyncIterator[str]:
    try:
        for event in head:
            yield sse(event)
        async for state, reply in call.replies(buffered):
            if reply.text or reply.logprobs or reply.finish_reason:
                if (event := piece(state, reply)) is not None:  # None: nothing to say yet
                    yield sse(event)
        for event in tail():
            yield sse(event)
        yield "data: [DONE]\n\n"
    except ApiError as e:
        if call.metrics is not None:  # the 200 went out: the middleware saw no error
            call.metrics.error(e.status)
        yield sse(e.body())
    except ClientGone:
        pass
    except Exception as e:  # the 200 is sent: all that is left is to say so in the stream
        logger.exception("unexpected error in a stream")
        yield sse(error_body(f"internal error: {type(e).__name__}", "server_error"))
    finally:
        call.close()
