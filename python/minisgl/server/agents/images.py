"""The agent APIs' images as chat ``image_url`` parts: a Responses ``input_image`` part and an
Anthropic ``image`` block (base64 or url source). Each part carries its agent field under
``FIELD_KEY`` until ``start_chat`` turns those into error names (``image_names``), so a bad image
is a 400 naming the field the client wrote."""

from __future__ import annotations

from typing import Any

from minisgl.multimodal.items import DETAILS, MediaError, check_keys
from minisgl.server.openai.errors import ApiError

FIELD_KEY = "_field"
MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # Anthropic's
# every key each API's image part may hold; ``cache_control`` is accepted without effect (the
# radix cache keeps every prefix, the image's included)
RESPONSES_KEYS = {"type", "image_url", "file_id", "detail"}
ANTHROPIC_KEYS = {"type", "source", "cache_control"}
SOURCE_KEYS = {"base64": {"type", "media_type", "data"}, "url": {"type", "url"}}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def _keys(part: dict, allowed: set[str], param: str) -> None:
    try:
        check_keys(part, allowed, param)
    except MediaError as e:
        raise ApiError(400, str(e), e.param) from None


def responses_image(part: dict, param: str) -> dict:
    _keys(part, RESPONSES_KEYS, param)
    if part.get("detail") not in (None, *DETAILS):
        raise _bad(f"{param}.detail", f"must be one of {', '.join(DETAILS)}")
    if part.get("file_id") is not None:
        raise _bad(f"{param}.file_id", "file ids are not supported (give image_url)")
    url = {"url": part.get("image_url"), "detail": part.get("detail")}
    return {"type": "image_url", "image_url": url, FIELD_KEY: f"{param}.image_url"}


def anthropic_image(block: dict, param: str) -> dict:
    _keys(block, ANTHROPIC_KEYS, param)
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") not in SOURCE_KEYS:
        raise _bad(f"{param}.source.type", "must be base64 or url (file sources are not "
                   "supported)")
    kind = source["type"]
    _keys(source, SOURCE_KEYS[kind], f"{param}.source")
    if kind == "base64":
        if source.get("media_type") not in MEDIA_TYPES:
            raise _bad(f"{param}.source.media_type", f"must be one of {', '.join(MEDIA_TYPES)}")
        if not isinstance(source.get("data"), str):
            raise _bad(f"{param}.source.data", "must be a base64 string")
        url = f"data:{source['media_type']};base64,{source['data']}"
    else:
        url = source.get("url")
    return {"type": "image_url", "image_url": {"url": url}, FIELD_KEY: f"{param}.source"}


def image_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """The chat fields of the agent's image parts -> the agent's names (the keys are removed)."""
    names = {}
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and FIELD_KEY in part:
                names[f"messages[{i}].content[{j}].image_url"] = part.pop(FIELD_KEY)
    return names
