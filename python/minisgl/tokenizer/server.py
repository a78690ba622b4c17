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
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import zmq

from minisgl.message import (
    BACKEND_CODEC,
    DETOKENIZER_CODEC,
    FRONTEND_CODEC,
    TOKENIZER_CODEC,
    AbortBackendMsg,
    AbortMsg,
    BackendMsg,
    BatchBackendMsg,
    BatchDetokenizerMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    CacheFlushedMsg,
    DetokenizeMsg,
    DetokenizerMsg,
    FlushCacheBackendMsg,
    FlushCacheMsg,
    FrontendMsg,
    RequestErrorMsg,
    RequestsAcceptedMsg,
    StatsReply,
    TokenizerMsg,
    UserMsg,
    UserReply,
)
from minisgl.multimodal.config import MediaOptions
from minisgl.multimodal.processor import ImageProcessor
from minisgl.utils import init_logger
from minisgl.utils.heap import freeze_heap
from minisgl.utils.hf import load_tokenizer
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue
from minisgl.utils.startup import Phases

from .detokenize import IncrementalDetokenizer, kept_special_ids
from .harmony import Harmony
from .tokenize import TokenizeManager, one_line

if TYPE_CHECKING:
    from minisgl.utils.mp import ServerAddrs

logger = init_logger(__name__)

_POLL_MS = 100  # how often the loop looks at the stop flag and the parent
_MAX_DRAIN = 512  # messages taken from one inbox per round, so neither role starves the other
_MAX_STOPPED = 1 << 16  # stopped uids remembered (to drop their late tokens); oldest forgotten
# The scheduler says nothing to the detokenizer when the API aborts a request, so the state of a
# request that has not had a token for this long is dropped (a running one gets one per step).
_IDLE_S = 600.0


Outbox = tuple[list[FrontendMsg], list[BackendMsg]]


def tokenize_worker(
    model_path: str, addrs: ServerAddrs, *, tokenize: bool, detokenize: bool, ready: Connection,
    revision: str | None = None, chat_template: str | None = None,
    model_dir: str | None = None, media: MediaOptions | None = None,
) -> None:
    """Child-process entry point. Reports ``("ok", None)`` or ``("error", line)`` on ``ready``,
    then serves until SIGTERM/SIGINT or until its parent dies (no orphan outlives the server).
    ``model_path`` is where the tokenizer is (a directory or a repo id at ``revision``);
    ``chat_template`` replaces its template; ``model_dir`` is the checkpoint (a vision-language
    one's images are preprocessed here, under ``media``'s limits)."""
    parent = os.getppid()  # now, while the launcher surely waits for ``ready``
    phases = Phases(launch="spawned")  # where its start-up's seconds go (the "started" line)
    try:
        if not (tokenize or detokenize):
            raise ValueError("a tokenizer worker needs at least one role")
        tokenizer = load_tokenizer(model_path, revision, chat_template)
        phases.mark("tokenizer")
        harmony = Harmony.for_model(model_path) if tokenize else None  # gpt-oss's chat format
        images = (ImageProcessor.for_model(model_dir, tokenizer, media)
                  if tokenize and model_dir else None)
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


def _flatten(msgs: list[Any], batch: type) -> list[Any]:
    return [m for msg in msgs for m in (msg.msgs if isinstance(msg, batch) else [msg])]


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
                self.inboxes.append((inbox, _TokenizeRole(tokenizer, harmony, images)))
            if detokenize:
                inbox = self._open(ZmqPullQueue(addrs.detokenizer, True, DETOKENIZER_CODEC))
                self.inboxes.append((inbox, _DetokenizeRole(tokenizer)))
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


class _TokenizeRole:
    def __init__(self, tokenizer: Any, harmony: Harmony | None = None,
                 images: ImageProcessor | None = None) -> None:
        self.manager = TokenizeManager(tokenizer, harmony, images)

    def handle(self, msgs: list[TokenizerMsg]) -> Outbox:
        front: list[FrontendMsg] = []
        back: list[BackendMsg] = []
        for msg in _flatten(msgs, BatchTokenizerMsg):
            if isinstance(msg, AbortMsg):
                back.append(AbortBackendMsg(uid=msg.uid))
                continue
            if isinstance(msg, FlushCacheMsg):
                back.append(FlushCacheBackendMsg(uid=msg.uid))
                continue
            param = "messages" if msg.messages is not None else "prompt"
            try:
                ids, mm = self.manager.prompt(msg)
            except ValueError as e:  # a MediaError names the image's field
                front.append(UserReply(uid=msg.uid, error=str(e),
                                       error_param=getattr(e, "param", param), status=400))
            except Exception as e:  # a tokenizer bug must not kill the server
                logger.exception("tokenizing request %d failed", msg.uid)
                error = f"tokenization failed: {one_line(e)}"
                front.append(UserReply(uid=msg.uid, error=error, error_param=param, status=500))
            else:
                params = msg.sampling_params
                back.append(UserMsg(uid=msg.uid, input_ids=ids, sampling_params=params, mm=mm))
        return front, back


class _DetokenizeRole:
    """One IncrementalDetokenizer per running uid; one UserReply per uid per incoming round."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.reqs: OrderedDict[int, IncrementalDetokenizer | None] = OrderedDict()  # LRU first
        self.seen: dict[int, float] = {}  # uid -> when its last token came
        self.stopped: OrderedDict[int, None] = OrderedDict()  # by a stop string, not yet freed
        self._kept: frozenset[int] | None = None  # special tokens shown (on first use)

    def handle(self, msgs: list[DetokenizerMsg]) -> Outbox:
        replies: dict[int, UserReply] = {}
        others: list[FrontendMsg] = []
        back: list[BackendMsg] = []
        for msg in _flatten(msgs, BatchDetokenizerMsg):
            if isinstance(msg, DetokenizeMsg):
                self._token(msg, replies, back)
            elif isinstance(msg, RequestErrorMsg):
                self._drop(msg.uid)
                others.append(UserReply(
                    uid=msg.uid, error=msg.message, error_param=msg.param, status=msg.status
                ))
            elif isinstance(msg, RequestsAcceptedMsg):
                others += [UserReply(uid=uid, prompt_tokens=n)
                           for uid, n in zip(msg.uids, msg.prompt_lens)]
            elif isinstance(msg, CacheFlushedMsg):
                others.append(UserReply(uid=msg.uid, finish_reason="stop"))
            else:
                others.append(StatsReply(stats=msg))
        self._forget_idle()
        return [*replies.values(), *others], back

    def _forget_idle(self) -> None:
        horizon = time.monotonic() - _IDLE_S
        while self.reqs and self.seen[uid := next(iter(self.reqs))] < horizon:
            logger.debug("dropping the state of idle request %d (aborted?)", uid)
            self._drop(uid)

    def _drop(self, uid: int) -> None:
        self.reqs.pop(uid, None)
        self.seen.pop(uid, None)

    def _token(self, msg: DetokenizeMsg, replies: dict[int, UserReply], back: list) -> None:
        if msg.uid in self.stopped:
            if msg.finish_reason is not None:  # the scheduler is done with it after all
                del self.stopped[msg.uid]
            return
        try:
            self._detokenize(msg, replies, back)
        except Exception as e:  # one bad request must not take the others down
            logger.exception("detokenizing request %d failed", msg.uid)
            self._drop(msg.uid)
            replies[msg.uid] = UserReply(
                uid=msg.uid, error=f"detokenization failed: {one_line(e)}", status=500
            )
            if msg.finish_reason is None:
                self._stop(msg.uid, back)

    def _detokenize(self, msg: DetokenizeMsg, replies: dict[int, UserReply], back: list) -> None:
        uid, end = msg.uid, msg.finish_reason
        if uid not in self.reqs:  # the first token: it carries the stop strings and lengths
            self.reqs[uid] = self._new_detokenizer(msg.stop)
            replies[uid] = UserReply(
                uid=uid, token_ids=[], prompt_tokens=msg.prompt_len, cached_tokens=msg.cached_len,
                first_forward_time=msg.first_forward_time, prompt_logprobs=msg.prompt_logprobs,
            )
        detok = self.reqs[uid]
        self.reqs.move_to_end(uid)
        self.seen[uid] = time.monotonic()
        reply = replies.get(uid) or replies.setdefault(uid, UserReply(uid=uid, token_ids=[]))
        if msg.token is None:  # max_tokens=0: the request ends with its prompt
            if end is not None:
                reply.finish_reason = end
                self._drop(uid)
            return
        reply.token_ids.append(msg.token)
        if msg.logprob is not None:
            reply.logprobs = reply.logprobs or []
            reply.logprobs.append((msg.token, msg.logprob, list(msg.top_logprobs or [])))
        if detok is not None:
            text, end = detok.step(msg.token, end)
            reply.text += text
            if detok.stopped and msg.finish_reason is None:
                self._stop(uid, back)
        if end is not None:
            reply.finish_reason = end
            self._drop(uid)

    def _new_detokenizer(self, stop: tuple[str, ...]) -> IncrementalDetokenizer | None:
        """None when the model has no tokenizer: replies then carry token ids only."""
        if self.tokenizer is None:
            return None
        if self._kept is None:
            self._kept = kept_special_ids(self.tokenizer)
        return IncrementalDetokenizer(self.tokenizer, stop, keep=self._kept)

    def _stop(self, uid: int, back: list) -> None:
        """Ask the scheduler to free ``uid`` and drop the tokens it sends meanwhile."""
        back.append(AbortBackendMsg(uid=uid))
        self.stopped[uid] = None
        if len(self.stopped) > _MAX_STOPPED:
            self.stopped.popitem(last=False)
