"""FP8 with one scale per output channel (``--quantization fp8``): a bf16/fp16/fp32 checkpoint's
weight is loaded as is and quantized once its decoder layer is loaded (``weight [N, K]`` e4m3,
``weight_scale_inv [N, 1]`` fp32; activations per token). Kernels: ``fp8_dispatch.fp8_linear``.

Tensor parallelism: a column-parallel shard holds whole rows, so its rows' scales are TP=1's; a
row-parallel shard holds part of each row, so ``on_load`` keeps the largest magnitude of every
whole checkpoint row and the shard is quantized with it. Every TP size holds TP=1's values.

Fusions offered: an RMSNorm weight folded into the columns (``W @ (g * n) == (W * g) @ n``); the
norm before quantizing x per token for batches (where ``takes_quantized_input``); one token with
the norm, the residual add and gate-up's SiLU-and-mul inside the FP8 GEMV.
"""

from __future__ import annotations

import torch
from torch import nn

from . import fp8_dispatch
from .base import LinearMethod, MakeParam
from .fp8 import FP8, quantize_channel


class Fp8ChannelLinearMethod(LinearMethod):
    def __init__(self, norm_gemv: bool = True, norm_quant: bool = True) -> None:
        self.norm_gemv, self.norm_quant = norm_gemv, norm_quant

    @property
    def fuses_one_token(self) -> bool:  # type: ignore[override]
        return self.norm_gemv

    def create_weights(self, layer: nn.Module, out: int, inp: int, make_param: MakeParam) -> None:
        layer.weight = make_param(out, inp, deferred=True)
        layer.weight_scale_inv = None

    def on_load(self, layer: nn.Module, param: nn.Parameter, loaded) -> None:
        if (layer.shard_dim == 1 and param is layer.weight
                and loaded.shape[1] != param.shape[1]):  # a shard of the rows: read them whole
            whole = loaded.load() if hasattr(loaded, "load") else loaded
            layer._row_amax = whole.abs().amax(dim=1).float()

    def process_weights_after_loading(self, layer: nn.Module,
                                      input_scale: torch.Tensor | None = None) -> None:
        if layer.weight.dtype == FP8:
            return
        w = layer.weight.data
        if input_scale is not None:
            w = w.float() * input_scale.float()
        amax = getattr(layer, "_row_amax", None)
        amax = None if amax is None else amax.to(layer.weight.device)
        assert amax is None or input_scale is None, "a row-parallel shard is never folded into"
        q, s = quantize_channel(w, amax)
        layer._row_amax = None
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale_inv = nn.Parameter(s, requires_grad=False)

    def apply(self, layer, x, bias, gated=False, norm_eps=None, residual=None, act=False):
        return fp8_dispatch.fp8_linear(x, layer.weight, layer.weight_scale_inv, None, bias, gated,
                                       norm_eps, residual, act, pdl=layer.pdl)

    def folds_input_scale(self, layer: nn.Module) -> bool:
        return layer.weight.dtype != FP8

    def takes_quantized_input(self, layer: nn.Module, dtype: torch.dtype) -> bool:
        return self.norm_quant and fp8_dispatch.takes_quantized_input(
            layer.weight, layer.weight_scale_inv, None, dtype)
