"""The tokenizer worker process: prompts -> token ids, and/or new tokens -> text.

Tokenize role: API --TokenizeMsg--> worker --UserMsg--> scheduler (errors go back to the API).
Detokenize role: scheduler --DetokenizeMsg--> worker --UserReply--> API; a matched stop string
also sends an AbortBackendMsg so the scheduler frees the request at once.
With ``num_tokenizer == 0`` one process has both roles and polls both inboxes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import zmq

from minisgl.message import (
    BACKEND_CODEC,
    DETOKENIZER_CODEC,
    FRONTEND_CODEC,
    TOKENIZER_CODEC,
    BatchBackendMsg,
    BatchFrontendMsg,
)
from minisgl.multimodal.config import MediaOptions
from minisgl.multimodal.processor import ImageProcessor
from minisgl.utils import init_logger
from minisgl.utils.heap import freeze_heap
from minisgl.utils.hf import load_tokenizer
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue
from minisgl.utils.startup import Phases

from .harmony import Harmony
from .roles import DetokenizeRole, TokenizeRole
from .tokenize import TokenizeManager, one_line

if TYPE_CHECKING:
    from minisgl.utils.mp import ServerAddrs

logger = init_logger(__name__)

_POLL_MS = 100  # how often the loop looks at the stop flag and the parent
_MAX_DRAIN = 512  # messages taken from one inbox per round, so neither role starves the other


def tokenize_worker(
    model_path: str, addrs: ServerAddrs, *, tokenize: bool, detokenize: bool, ready: Connection,
    revision: str | None = None, chat_template: str | None = None,
    model_dir: str | None = None, media: MediaOptions | None = None,
    cache_dir: str | None = None,
) -> None:
    """Child-process entry point. Reports ``("ok", None)`` or ``("error", line)`` on ``ready``,
    then serves until SIGTERM/SIGINT or until its parent dies (no orphan outlives the server).
    ``model_path`` is where the tokenizer is (a directory or a repo id at ``revision``);
    ``chat_template`` replaces its template; ``model_dir`` is the checkpoint (a vision-language
    one's images are preprocessed here, under ``media``'s limits); ``cache_dir``: where the
    tokenizer's class is kept (``load_tokenizer``)."""
    parent = os.getppid()  # now, while the launcher surely waits for ``ready``
    phases = Phases(launch="spawned")  # where its start-up's seconds go (the "started" line)
    try:
        if not (tokenize or detokenize):
            raise ValueError("a tokenizer worker needs at least one role")
        tokenizer = load_tokenizer(model_path, revision, chat_template, cache_dir)
        phases.mark("tokenizer")
        harmony = Harmony.for_model(model_path) if tokenize else None  # gpt-oss's chat format
        images = (ImageProcessor.for_model(model_dir, tokenizer, media, background=True)
                  if tokenize and model_dir else None)  # ready without waiting for it
        TokenizeManager(tokenizer, harmony).warm_up()  # the first chat request pays no compile
        worker = _Worker(tokenizer, addrs, tokenize, detokenize, harmony, images)
        phases.mark("chat template")
    except Exception as e:  # any start-up failure is reported, never raised into the void
        ready.send(("error", f"tokenizer worker failed to start: {one_line(e)}"))
        return
    try:
        flag = _StopFlag()  # after start-up: a failed start leaves the caller's handlers alone
        ready.send(("ok", None))
        logger.info("%s started: %s", mp.current_process().name, phases)
        freeze_heap()
        worker.run(flag, parent)
    finally:
        worker.close()


class _StopFlag:
    """Set by SIGTERM/SIGINT. An inherited SIG_IGN for SIGINT is kept: a launcher that wants its
    children to ignore Ctrl-C (to drain requests first) ignores SIGINT before spawning them."""

    def __init__(self) -> None:
        self.set = False
        signal.signal(signal.SIGTERM, self._handle)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.set = True


def _drain(queue: ZmqPullQueue) -> list[Any]:
    msgs = []
    while len(msgs) < _MAX_DRAIN and (msg := queue.get(timeout_ms=0)) is not None:
        msgs.append(msg)
    return msgs


def _send(queue: ZmqPushQueue, msgs: list[Any], batch: type) -> None:
    if msgs:
        queue.put(msgs[0] if len(msgs) == 1 else batch(msgs=msgs))


class _Worker:
    """Owns the queues of the roles it plays; ``run`` polls the inboxes until told to stop."""

    def __init__(
        self, tokenizer: Any, addrs: ServerAddrs, tokenize: bool, detokenize: bool,
        harmony: Harmony | None = None, images: ImageProcessor | None = None,
    ) -> None:
        self.queues: list[ZmqPullQueue | ZmqPushQueue] = []
        try:
            self.frontend = self._open(ZmqPushQueue(addrs.frontend, False, FRONTEND_CODEC))
            self.backend = self._open(ZmqPushQueue(addrs.backend, False, BACKEND_CODEC))
            self.inboxes: list[tuple[ZmqPullQueue, Any]] = []
            if tokenize:
                inbox = self._open(ZmqPullQueue(addrs.tokenizer, False, TOKENIZER_CODEC))
                self.inboxes.append((inbox, TokenizeRole(tokenizer, harmony, images)))
            if detokenize:
                inbox = self._open(ZmqPullQueue(addrs.detokenizer, True, DETOKENIZER_CODEC))
                self.inboxes.append((inbox, DetokenizeRole(tokenizer)))
        except BaseException:
            self.close()
            raise

    def _open(self, queue: Any) -> Any:
        self.queues.append(queue)
        return queue

    def run(self, flag: _StopFlag, parent: int) -> None:
        poller = zmq.Poller()
        for inbox, _ in self.inboxes:
            poller.register(inbox.socket, zmq.POLLIN)
        while not flag.set and os.getppid() == parent:
            ready = dict(poller.poll(_POLL_MS))
            for inbox, role in self.inboxes:
                if inbox.socket in ready:
                    front, back = role.handle(_drain(inbox))
                    _send(self.frontend, front, BatchFrontendMsg)
                    _send(self.backend, back, BatchBackendMsg)
        logger.info("tokenizer worker exiting (%s)", "signal" if flag.set else "parent died")

    def close(self) -> None:
        for queue in self.queues:
            queue.close()
        self.queues.clear()
