"""The API server's end of the pipeline: sends requests to the tokenizer workers and routes the
replies (from the tokenizer workers and the detokenizer) back to the HTTP handlers awaiting them.

One background task owns the receiving socket; handlers only ever read their own asyncio queue, so a
slow client never holds back the replies of the others. A ``Call`` is one HTTP request's view (its
choices, their replies, its client's disconnect); ``respond`` turns it into a JSON body or an SSE
stream, and whatever way the request ends, its backend requests are aborted or released.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Iterable

import msgspec
from starlette.responses import JSONResponse, Response, StreamingResponse

from minisgl.message import (
    FRONTEND_CODEC, TOKENIZER_CODEC, AbortMsg, BatchFrontendMsg, BatchTokenizerMsg, FrontendMsg,
    SchedulerStatsMsg, StatsReply, TokenizeMsg, TokenizerMsg, UserReply,
)
from minisgl.server.args import ServerAddrs
from minisgl.server.protocol import ApiError, error_body
from minisgl.server.responses import ChoiceState, sse
from minisgl.server.request_log import log_request
from minisgl.utils import init_logger
from minisgl.utils.mp import ZmqAsyncPullQueue, ZmqAsyncPushQueue

if TYPE_CHECKING:
    from minisgl.server.metrics import ServerMetrics

logger = init_logger(__name__)
POLL_S = 0.5  # how often a waiting handler checks that its client is still there


class FrontendManager:
    """Owns the two sockets of the API process. Must be created on the event loop that serves HTTP.

    ``healthy`` turns False when a child process died (the launcher's monitor sets it);
    ``ready`` says the workers are up. ``in_flight`` counts requests (one per choice) that the
    backend still runs: submitted, not finished, not aborted.
    """

    def __init__(self, addrs: ServerAddrs, ready: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._send_queue: ZmqAsyncPushQueue[TokenizerMsg] = ZmqAsyncPushQueue(
            addrs.tokenizer, bind=True, codec=TOKENIZER_CODEC
        )
        self._recv_queue: ZmqAsyncPullQueue[FrontendMsg] = ZmqAsyncPullQueue(
            addrs.frontend, bind=True, codec=FRONTEND_CODEC
        )
        self._queues: dict[int, asyncio.Queue[UserReply]] = {}
        self._running: set[int] = set()
        self._uids = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self.stats: SchedulerStatsMsg | None = None
        self.healthy = True
        self.ready = ready
        self._recv_task = self._loop.create_task(self._recv_loop())

    # ----------------------------------------------------------------- requests
    def new_uid(self) -> int:
        return next(self._uids)

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def submit(self, msgs: TokenizeMsg | list[TokenizeMsg]) -> asyncio.Queue[UserReply]:
        """Send one request (or the choices of one HTTP request, as one batch); their replies all
        arrive on the returned queue, told apart by ``uid``."""
        msgs = [msgs] if isinstance(msgs, TokenizeMsg) else msgs
        queue: asyncio.Queue[UserReply] = asyncio.Queue()
        for msg in msgs:
            self._queues[msg.uid] = queue
            self._running.add(msg.uid)
        await self._send_queue.put(msgs[0] if len(msgs) == 1 else BatchTokenizerMsg(msgs=msgs))
        return queue

    async def abort(self, *uids: int) -> None:
        self.abort_nowait(uids)

    def abort_nowait(self, uids: Iterable[int]) -> None:
        """Abort without awaiting: safe inside a cancelled task (a disconnected stream's cleanup),
        where any ``await`` would be cancelled again before the message left."""
        uids = list(uids)
        running = [uid for uid in uids if uid in self._running]
        self.release(uids)
        if not running:
            return
        aborts = [AbortMsg(uid=uid) for uid in running]
        msg = aborts[0] if len(aborts) == 1 else BatchTokenizerMsg(msgs=aborts)
        task = self._loop.create_task(self._send_queue.put(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def release(self, uids: Iterable[int]) -> None:
        """Forget requests that are done (their late replies, if any, are dropped)."""
        for uid in uids:
            self._queues.pop(uid, None)
            self._running.discard(uid)

    # ----------------------------------------------------------------- failures
    def fail_all(self, message: str, status: int = 503) -> None:
        """End every in-flight request with an error reply (a child process died)."""
        for uid, queue in list(self._queues.items()):
            queue.put_nowait(UserReply(uid=uid, error=message, status=status))
        self._running.clear()

    def fail_all_threadsafe(self, message: str, status: int = 503) -> None:
        """``fail_all`` from another thread (the launcher's monitor)."""
        try:
            self._loop.call_soon_threadsafe(self.fail_all, message, status)
        except RuntimeError:  # the loop is already closed: nobody is waiting any more
            pass

    def workers_lost(self, message: str) -> None:
        """A worker process died: unhealthy from now on, in-flight requests fail, and the
        scheduler's last stats are dropped (they describe a process that no longer exists)."""
        self.healthy = False
        self.stats = None
        self.fail_all(message)

    def workers_lost_threadsafe(self, message: str) -> None:
        self.healthy = False
        try:
            self._loop.call_soon_threadsafe(self.workers_lost, message)
        except RuntimeError:
            pass

    def cut_all(self, message: str) -> int:
        """End every HTTP request still waiting (shutdown's deadline) with a 503; how many."""
        calls = len({id(queue) for queue in self._queues.values()})
        self.fail_all(message)
        return calls

    # ----------------------------------------------------------------- receiving
    async def _recv_loop(self) -> None:
        while True:
            try:
                msg = await self._recv_queue.get()
            except msgspec.DecodeError:  # one malformed message must not stop every request
                logger.exception("dropping an undecodable frontend message")
                continue
            except Exception:  # the socket itself failed: nothing will ever arrive again
                logger.exception("the frontend socket failed; the server is unhealthy")
                self.workers_lost("the API server lost its connection to the workers")
                return
            self._dispatch(msg)

    def _dispatch(self, msg: FrontendMsg) -> None:
        if isinstance(msg, BatchFrontendMsg):
            for sub in msg.msgs:
                self._dispatch(sub)
        elif isinstance(msg, StatsReply):
            if self.healthy:  # a late message from before a worker died is no longer true
                self.stats = msg.stats
        elif isinstance(msg, UserReply):
            if msg.finish_reason is not None or msg.error is not None:
                self._running.discard(msg.uid)
            queue = self._queues.get(msg.uid)
            if queue is not None:
                queue.put_nowait(msg)

    async def close(self) -> None:
        self._recv_task.cancel()
        try:
            await self._recv_task
        except asyncio.CancelledError:
            pass
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)
        self._send_queue.close()
        self._recv_queue.close()


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

    async def start(self, msgs: list[TokenizeMsg]) -> Call:
        try:
            self.queue = await self.frontend.submit(msgs)
        except BaseException:
            self.failed = True
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
            if not self.queue.empty():
                reply = self.queue.get_nowait()
                break
            try:
                reply = await asyncio.wait_for(self.queue.get(), POLL_S)
                break
            except asyncio.TimeoutError:
                pass
        if reply.error is not None:
            self.failed = True
            status = reply.status if reply.status >= 400 else 500
            raise ApiError(status, reply.error, reply.error_param)
        if reply.finish_reason == "abort":
            self.failed = True
            raise ApiError(503, "the server aborted the request", code="aborted")
        state = self.states[reply.uid]
        state.add(reply)
        return state, reply

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
        log_request(rid, self.states.values(), self.arrival, self.failed, self.prompt)


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
    ``piece`` per reply with news, ``tail`` events, ``[DONE]``. A stream starts only once every
    choice has replied, so that a backend error is still an HTTP error."""
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
