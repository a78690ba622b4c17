"""Gemma 3's image encoder: the SigLIP vision transformer (``vision_tower.vision_model.`` in the
released checkpoints) and the multimodal projector (``multi_modal_projector.``).

Every image is resized to one square (``image_size``, 896 for the releases), so the tower sees a
fixed ``(image_size / patch)^2`` grid with a learned position per patch: pre-norm blocks of
bidirectional attention and a GELU-tanh MLP, then a final LayerNorm. The projector average-pools
the patch grid down to ``mm_tokens_per_image`` tokens (a 4 x 4 pool: 4096 patches -> 256),
applies Gemma's ``(1 + w)`` RMSNorm and one matrix into the text model's width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.norm import RMSNorm

from .base import VisionTower


@dataclass(frozen=True)
class SiglipConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    text_hidden_size: int
    tokens_per_image: int = 256
    num_channels: int = 3
    eps: float = 1e-6

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SiglipConfig:
        from minisgl.models.gemma3 import TEXT_DEFAULTS

        vc, text = raw["vision_config"], raw.get("text_config") or {}
        act = vc.get("hidden_act", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"vision_config.hidden_act {act!r} is not supported")
        cfg = cls(hidden_size=vc.get("hidden_size", 768),
                  intermediate_size=vc.get("intermediate_size", 3072),
                  num_layers=vc.get("num_hidden_layers", 12),
                  num_heads=vc.get("num_attention_heads", 12),
                  image_size=vc.get("image_size", 224), patch_size=vc.get("patch_size", 16),
                  text_hidden_size=text.get("hidden_size", TEXT_DEFAULTS["hidden_size"]),
                  tokens_per_image=raw.get("mm_tokens_per_image", 256),
                  num_channels=vc.get("num_channels", 3), eps=vc.get("layer_norm_eps", 1e-6))
        side, per_side = cfg.patches_per_side, int(cfg.tokens_per_image ** 0.5)
        if per_side ** 2 != cfg.tokens_per_image or side % per_side:
            raise ValueError(f"mm_tokens_per_image {cfg.tokens_per_image} must be a square "
                             f"whose side divides the {side} x {side} patch grid")
        return cfg

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


class SiglipLayer(nn.Module):
    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.layer_norm1 = nn.LayerNorm(d, eps=cfg.eps)
        self.layer_norm2 = nn.LayerNorm(d, eps=cfg.eps)
        self.self_attn = nn.ModuleDict({n: nn.Linear(d, d)
                                        for n in ("q_proj", "k_proj", "v_proj", "out_proj")})
        self.mlp = nn.ModuleDict({"fc1": nn.Linear(d, cfg.intermediate_size),
                                  "fc2": nn.Linear(cfg.intermediate_size, d)})
        self.num_heads = cfg.num_heads

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (self.self_attn[p](x).view(b, n, self.num_heads, -1).transpose(1, 2)
                   for p in ("q_proj", "k_proj", "v_proj"))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.self_attn["out_proj"](out.transpose(1, 2).reshape(b, n, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.layer_norm1(x))
        h = F.gelu(self.mlp["fc1"](self.layer_norm2(x)), approximate="tanh")
        return x + self.mlp["fc2"](h)


class Gemma3VisionTower(VisionTower):
    prefixes = {"vision_tower.vision_model.": "vision.", "model.vision_tower.vision_model.":
                "vision.", "vision_tower.": "vision.", "model.vision_tower.": "vision.",
                "multi_modal_projector.": "projector.", "model.multi_modal_projector.":
                "projector."}

    def __init__(self, cfg: SiglipConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.default_max_tokens = cfg.tokens_per_image  # every image takes as many
        d, p = cfg.hidden_size, cfg.patch_size
        self.vision = nn.Module()
        self.vision.embeddings = nn.Module()
        self.vision.embeddings.patch_embedding = nn.Linear(cfg.num_channels * p * p, d)
        self.vision.embeddings.position_embedding = nn.Embedding(cfg.patches_per_side ** 2, d)
        self.vision.encoder = nn.Module()
        self.vision.encoder.layers = nn.ModuleList(SiglipLayer(cfg) for _ in range(cfg.num_layers))
        self.vision.post_layernorm = nn.LayerNorm(d, eps=cfg.eps)
        self.projector = nn.Module()
        self.projector.mm_input_projection_weight = nn.Parameter(
            torch.zeros(d, cfg.text_hidden_size))
        self.projector.mm_soft_emb_norm = RMSNorm(d, cfg.eps, offset=1.0)  # Gemma's (1 + w)

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> Gemma3VisionTower:
        return cls(SiglipConfig.from_dict(raw))

    def local_name(self, name: str) -> str | None:
        # SigLIP's attention-pooling head: not part of Gemma 3 (the releases have none)
        return None if name.startswith("vision.head.") else name

    def convert(self, name: str, tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        if name.endswith("patch_embedding.weight"):  # Conv2d [out, C, P, P] -> linear
            return tensor.reshape(tensor.shape[0], -1)
        return tensor

    def dummy_input(self, num_tokens: int) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
        side, count = self.cfg.image_size, max(1, num_tokens // self.cfg.tokens_per_image)
        return [self._zeros(self.cfg.num_channels, side, side) for _ in range(count)], [()] * count

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, C, S, S]`` images -> ``[B, tokens_per_image, text_hidden]``."""
        cfg, emb = self.cfg, self.vision.embeddings
        b, c, p, side = pixels.shape[0], cfg.num_channels, cfg.patch_size, cfg.patches_per_side
        patches = pixels.reshape(b, c, side, p, side, p).permute(0, 2, 4, 1, 3, 5)
        x = emb.patch_embedding(patches.reshape(b, side * side, c * p * p))
        x = x + emb.position_embedding.weight
        for layer in self.vision.encoder.layers:
            x = layer(x)
        x = self.vision.post_layernorm(x)
        grid = x.transpose(1, 2).reshape(b, -1, side, side)
        pool = side // int(cfg.tokens_per_image ** 0.5)
        x = F.avg_pool2d(grid, pool, pool).flatten(2).transpose(1, 2)
        x = self.projector.mm_soft_emb_norm(x)
        return x @ self.projector.mm_input_projection_weight

    def forward(self, pixels: list[torch.Tensor], grids: list[tuple[int, ...]]
                ) -> list[torch.Tensor]:
        """``pixels[i]``: one ``[C, S, S]`` (or ``[1, C, S, S]``) image; grids are unused (every
        image has the same square grid)."""
        dtype = self.vision.embeddings.patch_embedding.weight.dtype
        batch = torch.stack([p.reshape(p.shape[-3:]) for p in pixels]).to(dtype)
        return list(self.encode(batch).unbind(0))
