"""API server -> tokenizer workers."""

from __future__ import annotations

from typing import Any, Union

from minisgl.multimodal.items import ImageItem
from minisgl.params import SamplingParams

from .base import Codec, Msg


class BaseTokenizerMsg(Msg):
    pass


class TokenizeMsg(BaseTokenizerMsg):
    """Exactly one of ``text``, ``input_ids`` and ``messages`` (a chat, templated by the worker)."""

    uid: int
    sampling_params: SamplingParams
    text: str | None = None
    input_ids: list[int] | None = None
    messages: list[dict] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables of the chat template
    tools: list[dict] | None = None  # OpenAI tool definitions for the chat template
    # the images of ``messages`` in order, one per ``{"type": "image"}`` content part
    images: list[ImageItem] | None = None


class AbortMsg(BaseTokenizerMsg):
    uid: int


class FlushCacheMsg(BaseTokenizerMsg):
    """Empty the prefix cache (``POST /flush_cache``); answered under ``uid`` like a request."""

    uid: int


class BatchTokenizerMsg(BaseTokenizerMsg):
    msgs: list[Union[TokenizeMsg, AbortMsg, FlushCacheMsg]]


TokenizerMsg = Union[TokenizeMsg, AbortMsg, FlushCacheMsg, BatchTokenizerMsg]
TOKENIZER_CODEC: Codec[TokenizerMsg] = Codec(TokenizerMsg)
