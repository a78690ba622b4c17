"""Reference MoE: loop over the experts that received tokens. Exact, device-agnostic, not fast.

Quantized experts are dequantized one routed expert at a time into x's dtype (FP8 blocks,
MXFP4), so the arithmetic after that is the unquantized path's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernel.ops import silu_and_mul
from minisgl.quant.fp8 import dequantize_block
from minisgl.quant.mxfp4 import dequantize_mxfp4

from .base import SILU, BaseMoeBackend, Mxfp4Scales


def expert_weights(w13: torch.Tensor, w2: torch.Tensor, scales, expert: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``expert``'s ``(w13 [2I, H], w2 [H, I])`` in ``dtype``, whatever the storage."""
    w_in, w_out = w13[expert], w2[expert]
    if isinstance(scales, Mxfp4Scales):
        return (dequantize_mxfp4(w_in, scales.w13[expert], dtype),
                dequantize_mxfp4(w_out, scales.w2[expert], dtype))
    if scales is not None:  # FP8 blocks
        return (dequantize_block(w_in, scales[0][expert], scales[2], dtype),
                dequantize_block(w_out, scales[1][expert], scales[2], dtype))
    return w_in, w_out


class TorchMoeBackend(BaseMoeBackend):
    def forward(self, x, w13, w2, topk_weights, topk_ids, scales=None, *, bias=None, act=SILU,
                pdl=False, layout=None):
        out = torch.zeros_like(x)
        flat_ids = topk_ids.flatten()
        order = flat_ids.argsort(stable=True)
        counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
        tokens = order // topk_ids.shape[1]
        b13 = bias.w13 if bias is not None else None
        b2 = bias.w2 if bias is not None else None
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            idx = order[start : start + count]
            rows = tokens[start : start + count]
            start += count
            w_in, w_out = expert_weights(w13, w2, scales, expert, x.dtype)
            h = F.linear(x[rows], w_in, None if b13 is None else b13[expert])
            h = silu_and_mul(h) if act == SILU else act(h)
            h = F.linear(h, w_out, None if b2 is None else b2[expert])
            out.index_add_(0, rows, h * topk_weights.flatten()[idx, None])
        return out
