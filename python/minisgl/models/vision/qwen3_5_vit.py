"""Qwen3.5 / Qwen3.6's vision transformer (``model.visual.`` of ``Qwen3_5ForConditionalGeneration``
and ``Qwen3_5MoeForConditionalGeneration``).

An image arrives as ``grid = (t, h, w)`` patches of ``temporal_patch_size x patch x patch``
pixels, already flattened by the preprocessor in spatial-merge-block order (each ``m x m`` block
of neighbouring patches consecutive). The patch embedding (a Conv3d whose stride is its kernel,
so a linear map of the flattened patch), plus a learned ``side x side`` position table resampled
bilinearly (align_corners) to the image's grid, feeds pre-norm blocks with full bidirectional
attention within each frame and a 2D rotary embedding (the first half of the rotated dims turn
with the patch's row, the second with its column). The merger then folds each ``m x m`` block
into one token of the language model's width. The released configs have no deepstack layers
(``deepstack_visual_indexes`` is empty): features enter the decoder only as input embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import VisionTower, near_square


@dataclass(frozen=True)
class Qwen3_5VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    rope_theta: float = 10_000.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Qwen3_5VisionConfig:
        vc = raw["vision_config"]
        if vc.get("deepstack_visual_indexes"):
            raise ValueError("vision_config.deepstack_visual_indexes: deepstack features are not "
                             "supported (the Qwen3.5/3.6 releases have none)")
        act = vc.get("hidden_act", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"vision_config.hidden_act {act!r} is not supported")
        names = ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size",
                 "in_channels", "patch_size", "temporal_patch_size", "spatial_merge_size",
                 "num_position_embeddings")
        theta = (vc.get("rope_parameters") or {}).get("rope_theta", cls.rope_theta)
        return cls(**{k: vc[k] for k in names if k in vc}, rope_theta=float(theta))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def block_order(h: int, w: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of each patch of an ``h x w`` grid in spatial-merge-block order."""
    raster = torch.arange(h * w).view(h // m, m, w // m, m).permute(0, 2, 1, 3).flatten()
    return raster // w, raster % w


def bilinear_taps(n: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``n`` target positions on a ``side``-long table (align_corners): the two source
    indices of each and their weights."""
    src = torch.arange(n, dtype=torch.float32) * (side - 1) / max(n - 1, 1)
    low = src.floor()
    frac = src - low
    low = low.long()
    return torch.stack([low, (low + 1).clamp(max=side - 1)], -1), torch.stack([1 - frac, frac], -1)


class VisionBlock(nn.Module):
    def __init__(self, cfg: Qwen3_5VisionConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(d, 3 * d)
        self.attn.proj = nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = nn.Linear(d, cfg.intermediate_size)
        self.mlp.linear_fc2 = nn.Linear(cfg.intermediate_size, d)
        self.num_heads = cfg.num_heads

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  lengths: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.attn.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)
        q, k = ((t.float() * cos + rotate_half(t.float()) * sin).to(v.dtype) for t in (q, k))
        # [1, heads, n, d]: 4-D, or SDPA takes its math path and materializes n x n scores
        out = [F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in seg))[0]
               for seg in zip(q.split(lengths), k.split(lengths), v.split(lengths))]
        return self.attn.proj(torch.cat([o.transpose(0, 1) for o in out]).reshape(n, -1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                lengths: list[int]) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), cos, sin, lengths)
        h = F.gelu(self.mlp.linear_fc1(self.norm2(x)), approximate="tanh")
        return x + self.mlp.linear_fc2(h)


class Qwen3_5VisionTower(VisionTower):
    prefixes = {"model.visual.": ""}
    # the releases' processor: at most 16 Mi pixels an image (size.longest_edge), one token for
    # each 32 x 32 (a 16-pixel patch, merged 2 x 2)
    default_max_tokens = 16384

    def __init__(self, cfg: Qwen3_5VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, m2 = cfg.hidden_size, cfg.spatial_merge_size ** 2
        self.patch_embed = nn.Linear(cfg.patch_dim, d)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, d)
        self.side = int(cfg.num_position_embeddings ** 0.5)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = nn.Module()
        self.merger.norm = nn.LayerNorm(d, eps=1e-6)
        self.merger.linear_fc1 = nn.Linear(d * m2, d * m2)
        self.merger.linear_fc2 = nn.Linear(d * m2, cfg.out_hidden_size)

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> Qwen3_5VisionTower:
        return cls(Qwen3_5VisionConfig.from_dict(raw))

    def local_name(self, name: str) -> str | None:
        return name.replace("patch_embed.proj.", "patch_embed.")

    def convert(self, name: str, tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        if name == "patch_embed.weight":  # Conv3d [out, C, T, P, P] -> linear over the patch
            return tensor.reshape(tensor.shape[0], -1)
        return tensor

    def dummy_input(self, num_tokens: int) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
        m = self.cfg.spatial_merge_size
        a, b = near_square(num_tokens)
        return [self._zeros(m * a * m * b, self.cfg.patch_dim)], [(1, m * a, m * b)]

    def positions(self, grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The learned position embedding of each patch (resampled to the grid) and the angles
        of its 2D rotary embedding, in the patches' order."""
        t, h, w = grid
        rows, cols = block_order(h, w, self.cfg.spatial_merge_size)
        device = self.pos_embed.weight.device
        h_idx, h_wt = bilinear_taps(h, self.side)
        w_idx, w_wt = bilinear_taps(w, self.side)
        idx = (h_idx[rows, :, None] * self.side + w_idx[cols, None, :]).flatten(1)
        wt = (h_wt[rows, :, None] * w_wt[cols, None, :]).flatten(1)
        table = self.pos_embed.weight
        pos = (table[idx.to(device)] * wt.to(device, table.dtype)[..., None]).sum(1)
        dim = self.cfg.head_dim // 2
        inv_freq = 1.0 / self.cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
        angles = torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], -1)
        return pos.repeat(t, 1), angles.repeat(t, 1).to(device)

    def forward(self, pixels: list[torch.Tensor], grids: list[tuple[int, ...]]
                ) -> list[torch.Tensor]:
        """``pixels[i]``: ``[t*h*w, C*T*P*P]`` patches of the image of ``grids[i] = (t, h, w)``;
        returns ``[t*h*w / m^2, out_hidden_size]`` per image."""
        grids = [tuple(int(v) for v in g) for g in grids]
        x = self.patch_embed(torch.cat(pixels).to(self.patch_embed.weight.dtype))
        pos, angles = zip(*(self.positions(g) for g in grids))
        x = x + torch.cat(pos).to(x.dtype)
        angles = torch.cat(angles)
        emb = torch.cat([angles, angles], -1)[:, None, :]  # one head axis to broadcast over
        cos, sin = emb.cos(), emb.sin()
        lengths = [h * w for t, h, w in grids for _ in range(t)]  # attention within a frame
        for block in self.blocks:
            x = block(x, cos, sin, lengths)
        m2 = self.cfg.spatial_merge_size ** 2
        x = self.merger.norm(x).view(-1, self.cfg.hidden_size * m2)
        x = self.merger.linear_fc2(F.gelu(self.merger.linear_fc1(x)))
        return list(x.split([t * h * w // m2 for t, h, w in grids]))
