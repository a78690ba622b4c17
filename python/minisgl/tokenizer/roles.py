"""What a tokenizer worker does with its messages, one class a role: ``TokenizeRole`` turns
requests into token ids for the scheduler, ``DetokenizeRole`` turns the scheduler's tokens into
replies for the API (text, stop strings, log-probs). ``handle`` takes one round of messages and
returns what goes to the API and to the scheduler (``server.py`` owns the queues)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BackendMsg,
    BatchDetokenizerMsg,
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
from minisgl.multimodal.processor import ImageProcessor
from minisgl.utils import init_logger

from .detokenize import IncrementalDetokenizer, kept_special_ids
from .harmony import Harmony
from .tokenize import TokenizeManager, one_line

logger = init_logger(__name__)

_MAX_STOPPED = 1 << 16  # stopped uids remembered (to drop their late tokens); oldest forgotten
# The scheduler says nothing to the detokenizer when the API aborts a request, so the state of a
# request that has not had a token for this long is dropped (a running one gets one per step).
_IDLE_S = 600.0

Outbox = tuple[list[FrontendMsg], list[BackendMsg]]


def flatten(msgs: list[Any], batch: type) -> list[Any]:
    """Messages with the batches among them unpacked."""
    return [m for msg in msgs for m in (msg.msgs if isinstance(msg, batch) else [msg])]


class TokenizeRole:
    """Prompts in (chat messages, text, token ids, images) -> token ids to the scheduler."""

    def __init__(self, tokenizer: Any, harmony: Harmony | None = None,
                 images: ImageProcessor | None = None) -> None:
        self.manager = TokenizeManager(tokenizer, harmony, images)

    def handle(self, msgs: list[TokenizerMsg]) -> Outbox:
        front: list[FrontendMsg] = []
        back: list[BackendMsg] = []
        for msg in flatten(msgs, BatchTokenizerMsg):
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


class DetokenizeRole:
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
        for msg in flatten(msgs, BatchDetokenizerMsg):
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
