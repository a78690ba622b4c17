"""Fused Triton MoE backend: alignment plus two grouped GEMMs (``minisgl.kernel.triton.fused_moe``),
for experts in the model's dtype, FP8 blocks or MXFP4 (decoded inside the GEMMs).

No host sync and buffers sized from the batch alone, so decode steps can be captured in CUDA graphs
(the torch reference reads per-expert counts back to the host and cannot be).
"""

from __future__ import annotations

import torch

from minisgl.kernel.triton.fused_moe import fused_moe

from .base import SILU, BaseMoeBackend


class TritonMoeBackend(BaseMoeBackend):
    def forward(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor, scales=None, *, bias=None,
                act=SILU, pdl=False, layout=None) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        return fused_moe(x, w13, w2, topk_weights, topk_ids, scales=scales, bias=bias, act=act,
                         pdl=pdl)
