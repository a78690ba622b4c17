"""The API server's end of the pipeline: sends requests to the tokenizer workers and routes the
replies (from the tokenizer workers and the detokenizer) back to the HTTP handlers awaiting them.

One background task owns the receiving socket; handlers only ever read their own asyncio queue, so a
slow client never holds back the replies of the others (``call.py`` holds one HTTP request's view).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Iterable

import msgspec

from minisgl.message import (
    FRONTEND_CODEC,
    TOKENIZER_CODEC,
    AbortMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    FlushCacheMsg,
    FrontendMsg,
    SchedulerStatsMsg,
    StatsReply,
    TokenizeMsg,
    TokenizerMsg,
    UserReply,
)
from minisgl.utils import init_logger
from minisgl.utils.mp import ServerAddrs, ZmqAsyncPullQueue, ZmqAsyncPushQueue

logger = init_logger(__name__)


class FrontendManager:
    """Owns the two sockets of the API process. Must be created on the event loop that serves HTTP.

    ``healthy`` turns False when a child process died (the launcher's monitor sets it);
    ``ready`` says the workers are up; ``warm`` that the scheduler has said it is ready to serve
    (its stats message, sent from its loop once start-up and any warm-up are done): readiness.
    ``in_flight`` counts requests (one per choice) that the backend still runs: submitted, not
    finished, not aborted.
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
        self.warm = False
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

    async def flush_cache(self) -> UserReply:
        """Ask the scheduler to empty its prefix cache; its answer (``error`` set if requests
        were running) arrives like a request's last reply."""
        uid = self.new_uid()
        queue: asyncio.Queue[UserReply] = asyncio.Queue()
        self._queues[uid] = queue
        try:
            await self._send_queue.put(FlushCacheMsg(uid=uid))
            return await queue.get()
        finally:
            self._queues.pop(uid, None)

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
        self.warm = False
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
                self.warm = msg.stats.ready
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
