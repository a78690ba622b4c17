"""FP8 with one scale per ``block = (bn, bk)`` of the weight: the published FP8 checkpoints'
format (``weight`` e4m3, ``weight_scale_inv [cdiv(N, bn), cdiv(K, bk)]``, loaded shard by shard
like the weight: a scale's ranges are the weight's divided by the block), or ``--quantization
fp8-block`` (an unquantized checkpoint quantized into 128x128 blocks once its decoder layer is
loaded).
Activations are quantized per token and ``bk`` columns. Kernels: ``fp8_dispatch.fp8_linear``.
No fusion is offered: the layers run their norms and activations as kernels of their own.

MoE experts (``Fp8MoEMethod``) use block scales in both FP8 modes (the fused MoE kernel reads
block scales only): ``w13_scale_inv [E, 2I/bn, H/bk]``, ``w2_scale_inv [E, H/bn, I/bk]``, loaded
from the checkpoint or made once the layer is loaded (online).
"""

from __future__ import annotations

import torch
from torch import nn

from . import fp8_dispatch
from .base import LinearMethod, MakeParam, MoEMethod
from .fp8 import FP8, quantize_block


class Fp8BlockLinearMethod(LinearMethod):
    def __init__(self, block: tuple[int, int], online: bool) -> None:
        self.block, self.online = block, online

    def create_weights(self, layer: nn.Module, out: int, inp: int, make_param: MakeParam) -> None:
        if self.online:
            layer.weight = make_param(out, inp, deferred=True)
            layer.weight_scale_inv = None
            return
        bn, bk = self.block
        layer.weight = make_param(out, inp, dtype=FP8)
        layer.weight_scale_inv = make_param(-(-out // bn), -(-inp // bk), dtype=torch.float32,
                                            unit=self.block[layer.shard_dim])

    def process_weights_after_loading(self, layer: nn.Module,
                                      input_scale: torch.Tensor | None = None) -> None:
        assert input_scale is None, "block scales take no folded input scale"
        if not self.online or layer.weight.dtype == FP8:
            return
        q, s = quantize_block(layer.weight.data, self.block)
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale_inv = nn.Parameter(s, requires_grad=False)

    def apply(self, layer, x, bias, gated=False, norm_eps=None, residual=None, act=False):
        return fp8_dispatch.fp8_linear(x, layer.weight, layer.weight_scale_inv, self.block, bias,
                                       gated, norm_eps, residual, act, pdl=layer.pdl)


class Fp8MoEMethod(MoEMethod):
    def __init__(self, block: tuple[int, int], online: bool) -> None:
        self.block, self.online = block, online

    def create_weights(self, layer, experts, hidden, inter, make_param):
        layer.w13_scale_inv = layer.w2_scale_inv = None
        if self.online:
            layer.w13 = make_param("w13", experts, 2 * inter, hidden, deferred=True)
            layer.w2 = make_param("w2", experts, hidden, inter, deferred=True)
            return
        bn, bk = self.block
        layer.w13 = make_param("w13", experts, 2 * inter, hidden, dtype=FP8)
        layer.w2 = make_param("w2", experts, hidden, inter, dtype=FP8)
        layer.w13_scale_inv = make_param("w13", experts, -(-2 * inter // bn), -(-hidden // bk),
                                         dtype=torch.float32, unit=bn)
        layer.w2_scale_inv = make_param("w2", experts, -(-hidden // bn), -(-inter // bk),
                                        dtype=torch.float32, unit=bk)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if not self.online or layer.w13.dtype == FP8:
            return
        for name in ("w13", "w2"):
            q, s = _quantize_experts(getattr(layer, name).data, self.block)
            setattr(layer, name, nn.Parameter(q, requires_grad=False))
            setattr(layer, name + "_scale_inv", nn.Parameter(s, requires_grad=False))

    def experts(self, layer):
        return layer.w13, layer.w2, (layer.w13_scale_inv, layer.w2_scale_inv, self.block)


def _quantize_experts(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_block`` of ``w [E, N, K]`` one expert at a time: its float32 temporaries are one
    expert's, not the layer's (a few GB at 256 experts)."""
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    scales = []
    for e in range(w.shape[0]):
        q[e], s = quantize_block(w[e], block)
        scales.append(s)
    return q, torch.stack(scales)
