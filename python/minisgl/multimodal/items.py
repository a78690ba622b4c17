"""The image items a request carries, and the error every bad one becomes.

An API parses its image parts into ``ImageRef`` (the URL as the client sent it and the request
field it came from); the API server turns each into an ``ImageItem`` (its encoded bytes, fetched
or read from a data URL: ``fetch.py``), which travels to the tokenizer worker inside the
``TokenizeMsg``. Every problem with one image is a ``MediaError`` naming that field, which the
APIs answer with an HTTP 400.
"""

from __future__ import annotations

import msgspec

DETAILS = ("auto", "low", "high")
PART_KEYS = {"type", "image_url"}
URL_KEYS = {"url", "detail"}


class MediaError(ValueError):
    """A bad image (or too many): ``param`` is the request field at fault."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class ImageRef(msgspec.Struct, frozen=True):
    """``url``: a ``data:`` URL or an ``http(s)`` URL; ``field``: where the request gave it;
    ``detail``: OpenAI's hint, accepted on purpose without effect, as vLLM and SGLang do: the
    checkpoint's preprocessor decides the resolution (and so the tokens) from the image's size;
    OpenAI's fixed low-detail budget has no counterpart in these models."""

    url: str
    field: str
    detail: str | None = None


class ImageItem(msgspec.Struct, frozen=True):
    """One image's encoded bytes (PNG, JPEG, WebP or GIF), as the tokenizer worker decodes it."""

    data: bytes
    field: str


def image_ref(url: object, field: str, detail: object = None) -> ImageRef:
    """An ``ImageRef``, its URL and detail checked for shape (not fetched yet)."""
    if not isinstance(url, str) or not url:
        raise MediaError(field, "must be a data URL or an http(s) URL")
    if not url.startswith(("data:", "http://", "https://")):
        scheme = url.split(":", 1)[0] if ":" in url[:16] else "no scheme"
        raise MediaError(field, f"must be a data URL or an http(s) URL, not {scheme!r}")
    if detail is not None and detail not in DETAILS:
        raise MediaError(f"{field}.detail", f"must be one of {', '.join(DETAILS)}")
    return ImageRef(url, field, detail)


def check_keys(part: dict, allowed: set[str], field: str) -> None:
    """A key of an image part that nothing reads is a 400 naming it, never silently dropped."""
    for key in part:
        if key not in allowed:
            raise MediaError(f"{field}.{key}", f"unknown field (an image takes "
                             f"{', '.join(sorted(allowed))})")


def check_count(refs: list[ImageRef], limit: int, param: str = "messages") -> None:
    if len(refs) > limit:
        raise MediaError(param, f"{len(refs)} images, more than the {limit} a request may carry "
                         "(--limit-mm-per-prompt)")


def split_images(messages: list[dict]) -> tuple[list[dict], list[ImageRef]]:
    """OpenAI chat messages -> the messages the chat template takes and their images in order.

    In a message with an image, each ``image_url`` part becomes ``{"type": "image"}`` (what the
    vision models' templates place a placeholder for) and text parts stay parts; a message of
    text parts alone becomes one string, as for a text model. Images are taken in user messages
    only."""
    out: list[dict] = []
    refs: list[ImageRef] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts: list[dict] = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise MediaError(f"{where}.text", "must be a string")
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                if message.get("role") != "user":
                    raise MediaError(where, "images are taken in user messages only")
                image = part.get("image_url")
                check_keys(part, PART_KEYS, where)
                if isinstance(image, dict):
                    check_keys(image, URL_KEYS, f"{where}.image_url")
                url, detail = ((image.get("url"), image.get("detail")) if isinstance(image, dict)
                               else (image, None))
                refs.append(image_ref(url, f"{where}.image_url", detail))
                parts.append({"type": "image"})
            else:
                raise MediaError(f"{where}.type", f"content parts of type {kind!r} are not "
                                 "supported (text, image_url)")
        if not any(p["type"] == "image" for p in parts):
            parts = "".join(p["text"] for p in parts)  # type: ignore[assignment]
        out.append({**message, "content": parts})
    return out, refs
