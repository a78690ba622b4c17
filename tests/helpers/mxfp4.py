"""An MXFP4 quantizer of the tests' own, independent of ``minisgl.quant.mxfp4``: the nearest of the
16 e2m1 values by search, with a group exponent that never saturates (``ceil(log2(amax / 6))``,
where the package rounds the OCP way, ``floor(log2(amax)) - 2``). Its output is in gpt-oss's
checkpoint layout (``*_blocks [..., N, K/32, 16]``, ``*_scales [..., N, K/32]``)."""

from __future__ import annotations

import torch

VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` -> (blocks uint8 [..., N, K/32, 16], scales uint8 [..., N, K/32])."""
    *lead, n, k = w.shape
    groups = w.float().reshape(*lead, n, k // 32, 32)
    amax = groups.abs().amax(-1, keepdim=True).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0))
    codes = (groups / torch.exp2(exp)).unsqueeze(-1).sub(VALUES).abs().argmin(-1).to(torch.uint8)
    pairs = codes.reshape(*lead, n, k // 32, 16, 2)
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks, (exp.squeeze(-1) + 127).to(torch.uint8)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The inverse, float32 ``[..., N, K]``, by table lookup."""
    lo, hi = VALUES[(blocks & 15).long()], VALUES[(blocks >> 4).long()]
    values = torch.stack([lo, hi], -1).flatten(-2)  # [..., N, K/32, 32]
    values = values * torch.exp2(scales.float() - 127).unsqueeze(-1)
    return values.flatten(-2)


def quantized_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Experts ``w [E, N, K]`` -> (engine blocks [E, N, K/2], scales [E, N, K/32], the float32
    weights they stand for)."""
    blocks, scales = quantize(w)
    return blocks.flatten(-2).contiguous(), scales, dequantize(blocks, scales)
