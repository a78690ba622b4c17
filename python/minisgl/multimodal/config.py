"""The limits on images in requests, shared by the server (its flags) and the offline ``LLM``."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class MediaOptions:
    """``allowed_media_domains``: hosts whose ``http(s)`` image URLs are fetched (empty: none,
    only data URLs; ``*``: any host); ``allow_private_media``: also fetch from hosts that resolve
    to private, loopback or link-local addresses (never by default, even for a listed host);
    ``media_fetch_timeout``: seconds for a whole fetch; ``max_image_bytes``: an image's encoded
    size; ``max_image_pixels``: its decoded width x height; ``limit_mm_per_prompt``: images in
    one request."""

    allowed_media_domains: tuple[str, ...] = ()
    allow_private_media: bool = False
    media_fetch_timeout: float = 10.0
    max_image_bytes: int = 20 << 20
    max_image_pixels: int = 32 << 20  # 32 Mi pixels: 8192 x 4096; a bomb is refused unread
    limit_mm_per_prompt: int = 16

    def __post_init__(self) -> None:
        for name in ("media_fetch_timeout", "max_image_bytes", "max_image_pixels"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.limit_mm_per_prompt < 0:
            raise ValueError(f"limit_mm_per_prompt: must be >= 0, got {self.limit_mm_per_prompt}")

    def allows_host(self, host: str) -> bool:
        return "*" in self.allowed_media_domains or host.lower() in (
            d.lower() for d in self.allowed_media_domains)


def parse_mm_limit(text: str) -> int:
    """``--limit-mm-per-prompt``: a number of images, or vLLM's JSON (``{"image": 4}``; other
    modalities may only be 0)."""
    text = text.strip()
    if not text.startswith("{"):
        return int(text)
    try:
        limits = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"limit_mm_per_prompt: not JSON ({e})") from None
    if not isinstance(limits, dict) or not all(isinstance(v, int) for v in limits.values()):
        raise ValueError('limit_mm_per_prompt: expected {"image": N}')
    others = [k for k, v in limits.items() if k != "image" and v]
    if others:
        raise ValueError(f"limit_mm_per_prompt: only images are served, not {', '.join(others)}")
    return limits.get("image", MediaOptions.limit_mm_per_prompt)
