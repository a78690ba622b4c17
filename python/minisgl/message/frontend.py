"""Tokenizer workers / detokenizer -> API server: text, token ids and errors of each request."""

from __future__ import annotations

from typing import Union

from .base import Codec, Msg
from .detokenizer import SchedulerStatsMsg


class BaseFrontendMsg(Msg):
    pass


class UserReply(BaseFrontendMsg):
    """What a request produced since the last reply. ``text`` is the new, complete text (never a
    broken UTF-8 character, never part of a stop string); ``finish_reason`` ends the request.
    ``first_forward_time`` (with the first reply only) is ``DetokenizeMsg``'s, forwarded."""

    uid: int
    text: str = ""
    token_ids: list[int] = []
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first_forward_time: float = 0.0
    prompt_logprobs: list[tuple[int, float | None, list[tuple[int, float]]]] | None = None
    error: str | None = None
    error_param: str | None = None
    status: int = 200


class StatsReply(BaseFrontendMsg):
    stats: SchedulerStatsMsg


class BatchFrontendMsg(BaseFrontendMsg):
    msgs: list[Union[UserReply, StatsReply]]


FrontendMsg = Union[UserReply, StatsReply, BatchFrontendMsg]
FRONTEND_CODEC: Codec[FrontendMsg] = Codec(FrontendMsg)
