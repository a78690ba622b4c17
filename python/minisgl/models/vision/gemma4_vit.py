"""Gemma 4's image encoder (``model.vision_tower.``) and its embedder into the text model
(``model.embed_vision.``).

Unlike Gemma 3 it keeps each image's aspect ratio: the preprocessor resizes an image to an
``h x w`` grid of ``patch x patch`` patches (both sides multiples of the pooling kernel) and
flattens the patches in raster order. Each patch is projected (pixels mapped to [-1, 1] in the
model, not the preprocessor) plus a learned embedding of its column and one of its row. Gemma-style
blocks follow (RMSNorms before and after attention and MLP; q and k normalised with a scale, v
without, attention scale 1; a 2D rotary embedding whose first half of each head turns with the
column and second half with the row); with ``use_clipped_linears`` every projection clamps its
input and output to loaded bounds. The pooler averages each ``k x k`` block of patches, scales by
``sqrt(hidden)`` and standardizes with loaded statistics (float32); the embedder normalises
without a scale and projects into the text model's width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.norm import RMSNorm

from .base import VisionTower, near_square


@dataclass(frozen=True)
class Gemma4VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    patch_size: int
    pooling_kernel_size: int
    position_embedding_size: int
    text_hidden_size: int
    rope_theta: float = 100.0
    eps: float = 1e-6
    standardize: bool = False
    clipped_linears: bool = False

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Gemma4VisionConfig:
        vc, text = raw["vision_config"], raw.get("text_config") or {}
        act = vc.get("hidden_activation", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"vision_config.hidden_activation {act!r} is not supported")
        heads = vc.get("num_attention_heads", 12)
        return cls(hidden_size=vc.get("hidden_size", 768),
                   intermediate_size=vc.get("intermediate_size", 3072),
                   num_layers=vc.get("num_hidden_layers", 16), num_heads=heads,
                   num_kv_heads=vc.get("num_key_value_heads") or heads,
                   head_dim=vc.get("head_dim", 64), patch_size=vc.get("patch_size", 16),
                   pooling_kernel_size=vc.get("pooling_kernel_size", 3),
                   position_embedding_size=vc.get("position_embedding_size", 10240),
                   text_hidden_size=text["hidden_size"],
                   rope_theta=float((vc.get("rope_parameters") or {}).get("rope_theta", 100.0)),
                   eps=vc.get("rms_norm_eps", 1e-6), standardize=bool(vc.get("standardize")),
                   clipped_linears=bool(vc.get("use_clipped_linears")))


class ClippedLinear(nn.Module):
    """A bias-free linear map; with clipping, its input and output clamped to loaded bounds."""

    def __init__(self, cfg: Gemma4VisionConfig, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out, bias=False)
        self.clipped = cfg.clipped_linears
        if self.clipped:
            for name in ("input_min", "input_max", "output_min", "output_max"):
                self.register_buffer(name, torch.tensor(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return self.linear(x)
        x = self.linear(torch.clamp(x, self.input_min, self.input_max))
        return torch.clamp(x, self.output_min, self.output_max)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: Gemma4VisionConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.self_attn = nn.Module()
        for name, n_out in (("q_proj", cfg.num_heads * hd), ("k_proj", cfg.num_kv_heads * hd),
                            ("v_proj", cfg.num_kv_heads * hd)):
            setattr(self.self_attn, name, ClippedLinear(cfg, d, n_out))
        self.self_attn.o_proj = ClippedLinear(cfg, cfg.num_heads * hd, d)
        # Gemma 4's RMSNorms: ``x / rms(x) * w`` in fp32; v's without a weight
        self.self_attn.q_norm = RMSNorm(hd, cfg.eps, fp32=True)
        self.self_attn.k_norm = RMSNorm(hd, cfg.eps, fp32=True)
        self.v_norm = RMSNorm(hd, cfg.eps, scale=False)
        self.mlp = nn.Module()
        for name, (n_in, n_out) in (("gate_proj", (d, cfg.intermediate_size)),
                                    ("up_proj", (d, cfg.intermediate_size)),
                                    ("down_proj", (cfg.intermediate_size, d))):
            setattr(self.mlp, name, ClippedLinear(cfg, n_in, n_out))
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(d, cfg.eps, fp32=True))

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x``: one image's ``[n, d]``; ``cos``/``sin``: ``[n, 1, head_dim]``."""
        attn, n, hd = self.self_attn, x.shape[0], self.cfg.head_dim

        def rope(t: torch.Tensor) -> torch.Tensor:  # each half of the head rotates on its own
            halves = zip(t.chunk(2, -1), cos.chunk(2, -1), sin.chunk(2, -1))
            return torch.cat([p * c + rotate_half(p) * s for p, c, s in halves], -1)

        q = rope(attn.q_norm(attn.q_proj(x).view(n, -1, hd)))
        k = rope(attn.k_norm(attn.k_proj(x).view(n, -1, hd)))
        v = self.v_norm(attn.v_proj(x).view(n, -1, hd))
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # 4-D: SDPA's fused kernels
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0,
                                             enable_gqa=k.shape[1] != q.shape[1])[0]
        return attn.o_proj(out.transpose(0, 1).reshape(n, -1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.attention(self.input_layernorm(x), cos, sin))
        mlp, h = self.mlp, self.pre_feedforward_layernorm(x)
        h = mlp.down_proj(F.gelu(mlp.gate_proj(h), approximate="tanh") * mlp.up_proj(h))
        return x + self.post_feedforward_layernorm(h)


class Gemma4VisionTower(VisionTower):
    prefixes = {"model.vision_tower.": "vision.", "vision_tower.": "vision.",
                "model.embed_vision.": "embed.", "embed_vision.": "embed."}
    default_max_tokens = 1120  # the processor's largest max_soft_tokens

    def __init__(self, cfg: Gemma4VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.vision = nn.Module()
        self.vision.patch_embedder = nn.Module()
        self.vision.patch_embedder.input_proj = nn.Linear(3 * cfg.patch_size ** 2, d, bias=False)
        self.vision.patch_embedder.position_embedding_table = nn.Parameter(
            torch.zeros(2, cfg.position_embedding_size, d))
        self.vision.encoder = nn.Module()
        self.vision.encoder.layers = nn.ModuleList(EncoderLayer(cfg)
                                                   for _ in range(cfg.num_layers))
        if cfg.standardize:
            self.vision.register_buffer("std_bias", torch.zeros(d))
            self.vision.register_buffer("std_scale", torch.ones(d))
        self.embed = nn.Module()
        self.embed.embedding_projection = nn.Linear(d, cfg.text_hidden_size, bias=False)
        self.pooled_norm = RMSNorm(d, cfg.eps, scale=False)

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> Gemma4VisionTower:
        return cls(Gemma4VisionConfig.from_dict(raw))

    def dummy_input(self, num_tokens: int) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
        k = self.cfg.pooling_kernel_size
        a, b = near_square(num_tokens)
        return [self._zeros(k * a * k * b, 3 * self.cfg.patch_size ** 2)], [(k * a, k * b)]

    def encode(self, patches: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """One image's ``[h*w, 3*P*P]`` raster-order patches -> ``[h*w / k^2, text_hidden]``."""
        cfg, embedder = self.cfg, self.vision.patch_embedder
        h, w = grid
        cols, rows = torch.arange(w).repeat(h), torch.arange(h).repeat_interleave(w)
        table = embedder.position_embedding_table
        x = embedder.input_proj(2 * (patches - 0.5))
        x = x + table[0][cols.to(x.device)] + table[1][rows.to(x.device)]
        dim = cfg.head_dim // 2
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
        fx, fy = cols[:, None] * inv_freq, rows[:, None] * inv_freq
        angles = torch.cat([fx, fx, fy, fy], -1)[:, None, :].to(x.device)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.vision.encoder.layers:
            x = layer(x, cos, sin)
        k = cfg.pooling_kernel_size
        pooled = x.float().view(h // k, k, w // k, k, -1).mean((1, 3)).flatten(0, 1)
        pooled = pooled * cfg.hidden_size ** 0.5
        if cfg.standardize:
            pooled = (pooled - self.vision.std_bias.float()) * self.vision.std_scale.float()
        x = self.pooled_norm(pooled.to(x.dtype))
        return self.embed.embedding_projection(x)

    def forward(self, pixels: list[torch.Tensor], grids: list[tuple[int, ...]]
                ) -> list[torch.Tensor]:
        """``pixels[i]``: ``[h*w, 3*P*P]`` patches of the image of ``grids[i] = (h, w)``."""
        dtype = self.vision.patch_embedder.input_proj.weight.dtype
        return [self.encode(p.to(dtype), (int(g[0]), int(g[1]))) for p, g in zip(pixels, grids)]
