"""Reference MoE: loop over the experts that received tokens. Exact, device-agnostic, not fast."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.layers.activation import silu_and_mul
from minisgl.quant.fp8 import dequantize_block

from .base import BaseMoeBackend


class TorchMoeBackend(BaseMoeBackend):
    def forward(self, x, w13, w2, topk_weights, topk_ids, scales=None):
        out = torch.zeros_like(x)
        flat_ids = topk_ids.flatten()
        order = flat_ids.argsort(stable=True)
        counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
        tokens = order // topk_ids.shape[1]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            idx = order[start : start + count]
            rows = tokens[start : start + count]
            start += count
            w_in, w_out = w13[expert], w2[expert]
            if scales is not None:  # FP8: this expert's weights, dequantized
                w_in = dequantize_block(w_in, scales[0][expert], scales[2], x.dtype)
                w_out = dequantize_block(w_out, scales[1][expert], scales[2], x.dtype)
            h = F.linear(silu_and_mul(F.linear(x[rows], w_in)), w_out)
            out.index_add_(0, rows, h * topk_weights.flatten()[idx, None])
        return out
