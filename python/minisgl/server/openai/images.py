"""The images of a chat request, read in the API server: parsed from the content parts
(``multimodal.items.split_images``), counted against ``--limit-mm-per-prompt`` and loaded (data
URLs decoded, ``http(s)`` URLs fetched in threads, concurrently), so that the tokenizer worker,
which decodes and preprocesses them, never waits on the network. A model without a vision tower
refuses any non-text part, as it always has. ``PromptCounter`` renders a prompt, images included,
as the tokenizer worker does, to count its tokens without running it."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from fastapi import Request

from minisgl.message import TokenizeMsg
from minisgl.multimodal.fetch import load_image
from minisgl.multimodal.items import (
    ImageItem,
    ImageRef,
    MediaError,
    check_count,
    image_ref,
    split_images,
)
from minisgl.multimodal.processor import ImageProcessor
from minisgl.server.openai.errors import ApiError
from minisgl.server.openai.request_context import server_config
from minisgl.tokenizer.tokenize import TokenizeManager


def has_vision(model_path: str | None) -> bool:
    """Whether the served checkpoint has a vision tower minisgl can preprocess for."""
    from minisgl.models.vision import has_vision as config_has_vision

    path = os.path.join(model_path or "", "config.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return config_has_vision(json.load(f))


def chat_images(request: Request, messages: list[dict]) -> tuple[list[dict], list[ImageRef]]:
    """``messages`` for the chat template and their images, not loaded yet (a cheap check, made
    before the request's other checks)."""
    first = next((i for i, m in enumerate(messages) if isinstance(m.get("content"), list)), None)
    if first is None:
        return messages, []
    if not request.app.state.vision:
        param = f"messages[{first}].content"
        raise ApiError(400, f"{param}: only text content parts are supported", param)
    try:
        messages, refs = split_images(messages)
        check_count(refs, server_config(request).media.limit_mm_per_prompt)
    except MediaError as e:
        raise ApiError(400, str(e), e.param) from None
    return messages, refs


def generate_images(request: Request, image_data: str | list[str] | None,
                    text: str | None) -> list[ImageRef]:
    """``/generate``'s ``image_data`` (SGLang's: one URL or a list), for a text prompt whose
    placeholders they fill."""
    if image_data is None:
        return []
    urls = [image_data] if isinstance(image_data, str) else image_data
    if not request.app.state.vision:
        raise ApiError(400, "image_data: this model takes no images (it has no vision tower)",
                       "image_data")
    if text is None:
        raise ApiError(400, "image_data: images come with a text prompt, not input_ids",
                       "image_data")
    try:
        refs = [image_ref(url, f"image_data[{i}]") for i, url in enumerate(urls)]
        check_count(refs, server_config(request).media.limit_mm_per_prompt, "image_data")
    except MediaError as e:
        raise ApiError(400, str(e), e.param) from None
    return refs


async def load_images(request: Request, refs: list[ImageRef]) -> list[ImageItem] | None:
    """The images' bytes (None: no image), read or fetched concurrently in threads."""
    if not refs:
        return None
    media = server_config(request).media
    try:
        items = await asyncio.gather(*(asyncio.to_thread(load_image, ref, media)
                                       for ref in refs))
    except MediaError as e:
        raise ApiError(400, str(e), e.param) from None
    return list(items)


class PromptCounter:
    """A prompt's tokens as the tokenizer worker makes them (``/v1/messages/count_tokens``):
    the same ``TokenizeManager``, with the checkpoint's image processor, so each image counts
    the tokens its size expands to and the count equals the request's ``usage``. The processor
    loads on the first count, off the loop (a request with images needs it; one without does
    not wait for it)."""

    def __init__(self) -> None:
        self._manager: TokenizeManager | None = None

    async def count(self, request: Request, msg: TokenizeMsg) -> int:
        """``msg``'s prompt length; a bad prompt or image is a 400 naming its field."""
        tokens = request.app.state.tokens
        await tokens.get()
        if tokens.tokenizer is None:
            raise ApiError(400, "messages: this model has no tokenizer", "messages")
        if self._manager is None:
            self._manager = await asyncio.to_thread(self._load, request, tokens.tokenizer)
        try:
            return len(await asyncio.to_thread(self._manager.tokenize, msg))
        except MediaError as e:
            raise ApiError(400, str(e), e.param) from None
        except ValueError as e:
            raise ApiError(400, str(e), "messages") from None

    @staticmethod
    def _load(request: Request, tokenizer: Any) -> TokenizeManager:
        state = request.app.state
        images = (ImageProcessor.for_model(state.model_path, tokenizer,
                                           server_config(request).media)
                  if state.vision else None)
        return TokenizeManager(tokenizer, state.harmony, images)
