"""Rotary position embedding (neox layout: the two halves of the rotated dims turn together), in
every family's variant, one class:

* full or partial: ``cfg.head_dim`` dims of each head are rotated, the first ones; a head wider
  than that passes the rest through (the hybrid Qwen checkpoints rotate a quarter of the head);
* the frequencies' scaling (``cfg.scaling``'s ``rope_type``): ``linear``, ``llama3``, ``yarn``, or
  ``proportional`` (Gemma 4's global layers: the whole head turns, the first
  ``partial_rotary_factor`` of its frequencies the usual ``base ** (-2i / head_dim)`` and the
  rest zero, so those dims pass through).

cos/sin are precomputed once per (config, device) for every position up to the model's maximum,
times the scaling's attention factor (YaRN's; 1 for the others), as transformers applies it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.utils.fake import faking

if TYPE_CHECKING:
    from minisgl.models.config import RotaryConfig


def _inv_freq(cfg: RotaryConfig) -> torch.Tensor:
    exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
    inv_freq = 1.0 / (cfg.base**exponents)
    scaling = dict(cfg.scaling or ())
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "yarn":
        return _yarn_inv_freq(cfg.base**exponents, cfg, scaling)
    if kind == "proportional":
        turning = int(scaling.get("partial_rotary_factor", 1.0) * cfg.head_dim // 2)
        return torch.cat([inv_freq[:turning], torch.zeros(cfg.head_dim // 2 - turning)])
    raise ValueError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3, yarn, "
                     "proportional)")


def attention_factor(cfg: RotaryConfig) -> float:
    """What cos and sin are multiplied by: YaRN's attention temperature (``attention_factor``,
    else ``0.1 * mscale * ln(factor) + 1``, divided by the same for ``mscale_all_dim`` when both
    are given); 1 for the other scalings."""
    s = dict(cfg.scaling or ())
    if s.get("rope_type") != "yarn":
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = _yarn_factor(cfg, s)
    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    return mscale(factor)


def _yarn_factor(cfg: RotaryConfig, s: dict) -> float:
    factor = s.get("factor")
    old = s["original_max_position_embeddings"]
    return factor if factor is not None else cfg.max_position / old


def _yarn_inv_freq(pos_freqs: torch.Tensor, cfg: RotaryConfig, s: dict) -> torch.Tensor:
    """YaRN (gpt-oss, DeepSeek): dimensions that turn fewer than ``beta_slow`` times over the
    original context are interpolated (divided by ``factor``), those turning more than
    ``beta_fast`` times keep their frequency, a linear ramp blends the dimensions between."""
    dim, base = cfg.head_dim, cfg.base
    old = s["original_max_position_embeddings"]

    def dim_of(rotations: float) -> float:  # the dimension that turns that often over ``old``
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(s.get("beta_fast") or 32), dim_of(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (the original frequency), 0: interpolate
    return 1.0 / (_yarn_factor(cfg, s) * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by ``factor``, short ones kept, a smooth ramp between."""
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def cos_sin_cache(cfg: RotaryConfig, device: torch.device) -> torch.Tensor:
    """``[max_position, head_dim]``: cos then sin of every position, cached (a shadow run's
    fake tables apart: ``utils/fake.py``)."""
    return _cos_sin_cache(cfg, device, faking())


@lru_cache(maxsize=8)
def _cos_sin_cache(cfg: RotaryConfig, device: torch.device, fake: bool) -> torch.Tensor:
    positions = torch.arange(cfg.max_position, dtype=torch.float32)
    freqs = torch.outer(positions, _inv_freq(cfg))
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    factor = attention_factor(cfg)
    return (cache * factor if factor != 1.0 else cache).to(device)


def mrope_cos_sin(cfg: RotaryConfig, positions: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen's multimodal rotary: ``[3, T]`` (temporal, height, width) positions -> each token's
    cos and sin ``[T, head_dim / 2]`` (float32), every frequency turning with the position of
    its ``mrope_section`` (``multimodal/mrope.py``). Text tokens get plain RoPE's values."""
    from minisgl.multimodal.mrope import mrope_angles

    if cfg.mrope is None:
        raise ValueError("multimodal positions for a rotary embedding without mrope_section")
    section, interleaved = cfg.mrope
    angles = mrope_angles(positions, _inv_freq(cfg), section, interleaved)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class RotaryEmbedding(nn.Module):
    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def __init__(self, cfg: RotaryConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def table(self, positions: torch.Tensor, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos | sin table [rows, cfg.head_dim] float32, each token's row [T]): the cached table
        and the positions, or for ``[3, T]`` M-RoPE positions (a Qwen prompt with images) a table
        of the batch's own rows."""
        if positions.dim() == 2:
            table = torch.cat(mrope_cos_sin(self.cfg, positions), dim=-1)
            return table, torch.arange(positions.shape[1], device=positions.device)
        return cos_sin_cache(self.cfg, device), positions

    def partial(self, head_dim: int) -> bool:
        """Whether a head of ``head_dim`` dims keeps some of them unrotated."""
        return self.cfg.head_dim < head_dim

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, qo_heads, D], k: [T, kv_heads, D]; positions: [T] (or [3, T]: M-RoPE). The
        first ``cfg.head_dim`` of the D dims are rotated.

        On CUDA the Triton kernel rotates q and k in place (they are fresh activations) and returns
        them; elsewhere new tensors come back from the torch reference."""
        rot = self.cfg.head_dim
        table, rows = self.table(positions, q.device)
        if q.is_cuda and pow2(rot):
            from minisgl.kernel.triton.rotary import apply_rope_

            apply_rope_(rows, q[..., :rot], k[..., :rot], table, pdl=self.pdl)
            return q, k
        cos, sin = table[rows].unsqueeze(1).chunk(2, dim=-1)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        if rot == q.shape[-1]:
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        return (torch.cat([_rotate(q[..., :rot], cos, sin), q[..., rot:]], dim=-1),
                torch.cat([_rotate(k[..., :rot], cos, sin), k[..., rot:]], dim=-1))
