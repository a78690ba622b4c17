"""Tokenizer workers / detokenizer -> scheduler (rank 0 forwards them to the other ranks)."""

from __future__ import annotations

from typing import Union

from minisgl.multimodal.prompt import MultimodalPrompt
from minisgl.params import SamplingParams

from .base import Codec, Msg


class BaseBackendMsg(Msg):
    pass


class UserMsg(BaseBackendMsg):
    """``mm``: a prompt with images (``input_ids`` are its ids, the image tokens included)."""

    uid: int
    input_ids: list[int]
    sampling_params: SamplingParams
    mm: MultimodalPrompt | None = None


class AbortBackendMsg(BaseBackendMsg):
    uid: int


class FlushCacheBackendMsg(BaseBackendMsg):
    """Evict the whole prefix cache if no request runs or waits; rank 0 answers under ``uid``."""

    uid: int


class ExitMsg(BaseBackendMsg):
    """Finish what is running (up to the launcher's timeout), then exit."""


class BatchBackendMsg(BaseBackendMsg):
    msgs: list[Union[UserMsg, AbortBackendMsg, FlushCacheBackendMsg, ExitMsg]]


BackendMsg = Union[UserMsg, AbortBackendMsg, FlushCacheBackendMsg, ExitMsg, BatchBackendMsg]
BACKEND_CODEC: Codec[BackendMsg] = Codec(BackendMsg)
