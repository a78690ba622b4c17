"""An MXFP4 quantizer of the tests' own, independent of ``minisgl.quant.mxfp4``: the nearest of the
16 e2m1 values by search, with a group exponent that never saturates (``ceil(log2(amax / 6))``,
where the package rounds the OCP way, ``floor(log2(amax)) - 2``). Its output is in gpt-oss's
checkpoint layout (``*_blocks [..., N, K/32, 16]``, ``*_scales [..., N, K/32]``)."""

from __future__ import annotations

import torch

from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales
from minisgl.quant.mxfp4 import quantize_mxfp4

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


DEV = "cuda" if torch.cuda.is_available() else "cpu"
GPT_OSS = MoeActivation("swiglu_clamped", alpha=1.702, limit=7.0)


def mx_inputs(tokens, hidden, inter, experts, top_k, dtype, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13, s13, _ = quantized_experts(torch.randn(experts, 2 * inter, hidden, generator=g)
                                           / hidden**0.5)
    w2, s2, _ = quantized_experts(torch.randn(experts, hidden, inter, generator=g)
                                         / inter**0.5)
    logits = torch.randn(tokens, experts, generator=g)
    values, ids = torch.topk(logits, top_k, dim=-1)
    weights = values.softmax(-1)
    b = None
    if bias:
        b = ExpertBias(torch.randn(experts, 2 * inter, generator=g).to(DEV, dtype),
                       torch.randn(experts, hidden, generator=g).to(DEV, dtype) * 0.1)
    return (x.to(DEV, dtype), w13.to(DEV), w2.to(DEV), weights.to(DEV, dtype), ids.to(DEV),
            Mxfp4Scales(s13.to(DEV), s2.to(DEV)), b)


def gpt_oss_20b_case(tokens: int):
    """gpt-oss-20b's experts (32 x 2880 x 2880, top 4) on the GPU, random (standard MXFP4
    bytes), with a bf16 x, routing and biases: (x, w13, w2, weights, ids, scales, bias)."""
    e, h, inter, top_k = 32, 2880, 2880, 4
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, h, device="cuda", generator=g).bfloat16()
    w13, s13 = quantize_mxfp4(torch.randn(e, 2 * inter, h, device="cuda", generator=g) * 0.02)
    w2, s2 = quantize_mxfp4(torch.randn(e, h, inter, device="cuda", generator=g) * 0.02)
    values, ids = torch.topk(torch.randn(tokens, e, device="cuda", generator=g), top_k)
    weights = values.softmax(-1).bfloat16()
    bias = ExpertBias(torch.randn(e, 2 * inter, device="cuda", generator=g).bfloat16() * 0.1,
                      torch.randn(e, h, device="cuda", generator=g).bfloat16() * 0.1)
    return x, w13, w2, weights, ids, Mxfp4Scales(s13, s2), bias
