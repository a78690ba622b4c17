"""The vision towers of the vision-language checkpoints, one module per tower, chosen by the
checkpoint's architecture; a module is imported only when its tower is built."""

from __future__ import annotations

import importlib
from typing import Any

from .base import VisionTower, load_vision_tower

# architecture -> (module under minisgl.models.vision, class)
VISION_TOWERS: dict[str, tuple[str, str]] = {
    "Qwen3_5ForConditionalGeneration": ("qwen3_5_vit", "Qwen3_5VisionTower"),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_vit", "Qwen3_5VisionTower"),
    "Gemma3ForConditionalGeneration": ("siglip", "Gemma3VisionTower"),
    "Gemma4ForConditionalGeneration": ("gemma4_vit", "Gemma4VisionTower"),
}


def architecture(raw: dict[str, Any]) -> str:
    return (raw.get("architectures") or [""])[0]


def has_vision(raw: dict[str, Any]) -> bool:
    """Whether a checkpoint's ``config.json`` describes a vision tower that minisgl can build."""
    return architecture(raw) in VISION_TOWERS and isinstance(raw.get("vision_config"), dict)


def create_vision_tower(raw: dict[str, Any]) -> VisionTower:
    """The (unloaded, float32, CPU) tower of a checkpoint's ``config.json`` dict."""
    if not has_vision(raw):
        raise ValueError(f"{architecture(raw) or 'this model'} has no vision tower")
    module, name = VISION_TOWERS[architecture(raw)]
    cls = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return cls.from_config(raw)


__all__ = ["VISION_TOWERS", "VisionTower", "create_vision_tower", "has_vision",
           "load_vision_tower"]
