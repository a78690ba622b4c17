"""The agent APIs' images as chat ``image_url`` parts: a Responses ``input_image`` part and an
Anthropic ``image`` block (base64 or url source). Each part carries its agent field under
``FIELD_KEY`` until ``start_chat`` turns those into error names (``image_names``), so a bad image
is a 400 naming the field the client wrote."""

from __future__ import annotations

from typing import Any

from minisgl.server.openai.protocol import ApiError

FIELD_KEY = "_field"
MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # Anthropic's


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def responses_image(part: dict, param: str) -> dict:
    if part.get("file_id") is not None:
        raise _bad(f"{param}.file_id", "file ids are not supported (give image_url)")
    url = {"url": part.get("image_url"), "detail": part.get("detail")}
    return {"type": "image_url", "image_url": url, FIELD_KEY: f"{param}.image_url"}


def anthropic_image(block: dict, param: str) -> dict:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        if source.get("media_type") not in MEDIA_TYPES:
            raise _bad(f"{param}.source.media_type", f"must be one of {', '.join(MEDIA_TYPES)}")
        if not isinstance(source.get("data"), str):
            raise _bad(f"{param}.source.data", "must be a base64 string")
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif kind == "url":
        url = source.get("url")
    else:
        raise _bad(f"{param}.source.type", "must be base64 or url (file sources are not "
                   "supported)")
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
