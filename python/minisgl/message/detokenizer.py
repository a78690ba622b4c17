"""Scheduler -> detokenizer: new tokens, request errors, and the scheduler's state."""

from __future__ import annotations

from typing import Union

from .base import Codec, Msg


class BaseDetokenizerMsg(Msg):
    pass


class DetokenizeMsg(BaseDetokenizerMsg):
    """One new token of a request. ``prompt_len``, ``cached_len`` and ``stop`` (the request's stop
    strings) come with its first token only."""

    uid: int
    token: int
    finish_reason: str | None = None  # "stop", "length", "abort"
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    prompt_len: int = 0
    cached_len: int = 0
    stop: tuple[str, ...] = ()


class RequestErrorMsg(BaseDetokenizerMsg):
    """The scheduler refused a request (e.g. a prompt longer than the context)."""

    uid: int
    message: str
    param: str | None = None
    status: int = 400


class SchedulerStatsMsg(BaseDetokenizerMsg):
    num_running: int
    num_waiting: int
    num_aborted: int
    num_retractions: int
    kv_used_tokens: int
    kv_total_tokens: int
    cache_hit_tokens: int
    max_context_len: int


class BatchDetokenizerMsg(BaseDetokenizerMsg):
    msgs: list[Union[DetokenizeMsg, RequestErrorMsg, SchedulerStatsMsg]]


DetokenizerMsg = Union[DetokenizeMsg, RequestErrorMsg, SchedulerStatsMsg, BatchDetokenizerMsg]
DETOKENIZER_CODEC: Codec[DetokenizerMsg] = Codec(DetokenizerMsg)
