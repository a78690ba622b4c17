"""Scheduler -> detokenizer: new tokens, request errors, and the scheduler's state."""

from __future__ import annotations

from typing import Union

from .base import Codec, Msg


class BaseDetokenizerMsg(Msg):
    pass


class DetokenizeMsg(BaseDetokenizerMsg):
    """One new token of a request. ``prompt_len``, ``cached_len``, ``stop`` (the request's stop
    strings) and ``first_forward_time`` come with its first token only.

    ``first_forward_time`` is the Unix time at which the request's first forward was launched
    (0.0: unknown); the API subtracts the request's arrival from it to get its queue time, so the
    wait in the tokenizer and in the scheduler's queue are both counted."""

    uid: int
    token: int | None  # None: a max_tokens=0 request ends after its prompt (no token)
    finish_reason: str | None = None  # "stop", "length", "abort"
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    prompt_len: int = 0
    cached_len: int = 0
    stop: tuple[str, ...] = ()
    first_forward_time: float = 0.0
    # with the first token, when asked: (token id, log-prob or None, [(id, log-prob)]) per prompt
    # token from logprob_start_len on
    prompt_logprobs: list[tuple[int, float | None, list[tuple[int, float]]]] | None = None


class RequestsAcceptedMsg(BaseDetokenizerMsg):
    """The scheduler took these requests (they passed its checks): a stream may start before the
    first token, which a long prompt or a full queue can hold back for minutes. ``prompt_lens``:
    their prompts' tokens, in the order of ``uids`` (how many the prefix cache serves is known at
    the first token only)."""

    uids: list[int]
    prompt_lens: list[int]


class RequestErrorMsg(BaseDetokenizerMsg):
    """The scheduler refused a request (e.g. a prompt longer than the context)."""

    uid: int
    message: str
    param: str | None = None
    status: int = 400


class CacheFlushedMsg(BaseDetokenizerMsg):
    """The prefix cache of every rank is empty (the answer to ``FlushCacheBackendMsg``)."""

    uid: int
    freed_tokens: int


class SchedulerStatsMsg(BaseDetokenizerMsg):
    num_running: int
    num_waiting: int
    num_aborted: int
    num_retractions: int
    kv_used_tokens: int
    kv_total_tokens: int
    cache_hit_tokens: int
    max_context_len: int
    ready: bool = True  # False while the scheduler warms up: readiness (/health_generate) waits
    # what still compiles in the background after ready ("" when nothing): /health shows it
    warming: str = ""
    # hybrid models: recurrent-state slots of requests in use / in all, snapshots the radix cache
    # holds, and the state pool's bytes (all 0 for other models)
    state_slots_used: int = 0
    state_slots_total: int = 0
    state_snapshots: int = 0
    state_pool_bytes: int = 0
    # speculative decoding (minisgl/speculative/stats.py): the method ("" when off), verify steps
    # (one per request and step), drafted and accepted tokens, requests that could not speculate
    spec_method: str = ""
    spec_verify_steps: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_skipped_requests: int = 0


class BatchDetokenizerMsg(BaseDetokenizerMsg):
    msgs: list[Union[DetokenizeMsg, RequestsAcceptedMsg, RequestErrorMsg, CacheFlushedMsg,
                     SchedulerStatsMsg]]


DetokenizerMsg = Union[DetokenizeMsg, RequestsAcceptedMsg, RequestErrorMsg, CacheFlushedMsg,
                       SchedulerStatsMsg, BatchDetokenizerMsg]
DETOKENIZER_CODEC: Codec[DetokenizerMsg] = Codec(DetokenizerMsg)
