"""The vision towers of the vision-language checkpoints, one module per tower, chosen by the
checkpoint's architecture; a module is imported only when its tower is built."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from .base import VisionTower

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


def load_vision_tower(model_dir: str, raw: dict[str, Any], dtype: torch.dtype,
                      device: torch.device | str = "cpu") -> VisionTower:
    """Build the tower of ``raw`` (a checkpoint's ``config.json``) and load its weights from the
    safetensors files of ``model_dir`` (the other parts of the checkpoint are not read)."""
    from minisgl.models.weight import iter_weights

    tower = create_vision_tower(raw)
    tower.load_weights(iter_weights(model_dir))
    return tower.to(device=device, dtype=dtype).eval()


__all__ = ["VISION_TOWERS", "VisionTower", "create_vision_tower", "has_vision",
           "load_vision_tower"]
